// "Is this slug free?" from Node.js with node-redis (npm install redis),
// against bloomgrid's RESP port (or RedisBloom).  Only "definitely not in the
// filter" means free; "maybe", an error (bloomgrid answers one for a filter
// that does not exist) or no answer at all means: ask the database.
//
// usage: node check.js redis://HOST:PORT FILTER SLUG...   (RESP=3 for RESP3)
const { createClient } = require('redis');

async function isFree(client, filter, slug) {
  try {
    return !(await client.bf.exists(filter, slug)); // false, or 0 over RESP3
  } catch (err) {
    return false; // no answer: the database decides, never "free"
  }
}

async function main() {
  const [url, filter, ...slugs] = process.argv.slice(2);
  if (!url || !filter || slugs.length === 0) {
    console.error('usage: node check.js redis://HOST:PORT FILTER SLUG...');
    process.exit(2);
  }
  const client = createClient({
    url,
    RESP: Number(process.env.RESP || 2),
    socket: { connectTimeout: 2000, reconnectStrategy: false },
    disableOfflineQueue: true,
  });
  client.on('error', (err) => console.error('check.js:', err.message));
  let up = true;
  try {
    await client.connect();
  } catch (err) {
    up = false; // no filter: every answer comes from the database
  }
  for (const slug of slugs) {
    const free = up && (await isFree(client, filter, slug));
    console.log(`${slug}\t${free ? 'free' : 'ask the database'}`);
  }
  if (up) await client.quit();
}

main();
