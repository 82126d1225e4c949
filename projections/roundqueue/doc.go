// Package roundqueue provides a self-cleaning Redis queue that hands out
// items least recently handed out first, each at most once per period, and
// drops those older than a TTL.
//
// A queue lives in three keys sharing one Redis Cluster hash slot: a hash of
// payloads by id (rq:{name}:data), a sorted set of last dequeue times
// (rq:{name}:last) and one of creation times (rq:{name}:created); every change
// is a single Lua script, so concurrent users never see half an operation.
package roundqueue
