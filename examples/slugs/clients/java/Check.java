// "Is this slug free?" from Java with Jedis 5 (redis.clients:jedis), against
// bloomgrid's RESP port (or RedisBloom).  Only "definitely not in the filter"
// means free; "maybe", an error (bloomgrid answers one for a filter that does
// not exist) or no answer means: ask the database.
//
// usage: java -cp jedis.jar:... Check.java HOST PORT FILTER SLUG...
import redis.clients.jedis.JedisPooled;
import redis.clients.jedis.exceptions.JedisException;

public class Check {
  static boolean isFree(JedisPooled jedis, String filter, String slug) {
    try {
      return !jedis.bfExists(filter, slug);
    } catch (JedisException e) {
      return false; // no answer: the database decides, never "free"
    }
  }

  public static void main(String[] args) {
    if (args.length < 4) {
      System.err.println("usage: Check HOST PORT FILTER SLUG...");
      System.exit(2);
    }
    try (JedisPooled jedis = new JedisPooled(args[0], Integer.parseInt(args[1]))) {
      for (int i = 3; i < args.length; i++) {
        boolean free = isFree(jedis, args[2], args[i]);
        System.out.println(args[i] + "\t" + (free ? "free" : "ask the database"));
      }
    }
  }
}
