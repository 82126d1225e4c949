package localstacktest

import (
	"bytes"
	"maps"
	"sync"
)

// Env is the environment of a service on the stack's servers (NATS_URL,
// REDIS_URL, DATABASE_URL), with extra set over it; unset variables are "".
func (s *Stack) Env(extra map[string]string) func(string) string {
	kv := map[string]string{
		"NATS_URL":     s.NATS.ClientURL(),
		"REDIS_URL":    s.Redis.URL(),
		"DATABASE_URL": s.Postgres.URL(),
	}
	maps.Copy(kv, extra)
	return func(k string) string { return kv[k] }
}

// SyncBuffer collects what a running command or server writes; it is safe
// to read while they write.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
