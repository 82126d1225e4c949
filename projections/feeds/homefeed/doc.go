// Package homefeed reads home-feed pages from Redis for the API: the Reader
// follows the keyspace version in use and reads each page in one or two
// round trips; the PageCache keeps pages in the API process and keeps them
// true with Redis's client-side caching invalidations.
package homefeed
