// "Is this slug free?" from Go with go-redis v9
// (go get github.com/redis/go-redis/v9), against bloomgrid's RESP port (or
// RedisBloom).  Only "definitely not in the filter" means free; "maybe", an
// error (bloomgrid answers one for a filter that does not exist) or no
// answer means: ask the database.
//
// usage: go run check.go HOST:PORT FILTER SLUG...
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

func isFree(ctx context.Context, rdb *redis.Client, filter, slug string) bool {
	maybe, err := rdb.BFExists(ctx, filter, slug).Result()
	return err == nil && !maybe // an error never means "free"
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: check HOST:PORT FILTER SLUG...")
		os.Exit(2)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Args[1], Protocol: 2,
		DialTimeout: 2 * time.Second, ReadTimeout: 500 * time.Millisecond})
	defer rdb.Close()
	ctx := context.Background()
	for _, slug := range os.Args[3:] {
		answer := "ask the database"
		if isFree(ctx, rdb, os.Args[2], slug) {
			answer = "free"
		}
		fmt.Printf("%s\t%s\n", slug, answer)
	}
}
