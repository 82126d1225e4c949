// Package roundqueue provides a self-cleaning Redis queue whose items come out
// in the order of their last dequeue, each at most once per period: a
// dequeued item moves to the back and is not handed out again until
// Config.DequeuePeriod has passed, new items jump to the front, and items
// older than Config.TTL are dropped by Clean (or RunCleaner). A queue lives in
// three keys sharing one Redis Cluster hash slot: a hash of payloads by id
// (rq:{name}:data), a sorted set of last dequeue times (rq:{name}:last) and a
// sorted set of creation times (rq:{name}:created), both in Unix
// milliseconds; every change is a single Lua script, so concurrent users on
// any number of processes never see a half-applied operation.
package roundqueue
