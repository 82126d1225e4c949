package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Holding is a lease, or a member of a share, as the bucket holds it.
type Holding struct {
	// Role is the role; Partition the partition of a shared role's lease
	// (-1 for a role's own lease or a member).
	Role      string
	Partition int
	Member    bool
	Process   string
	Epoch     uint64
	// Renewed is when the holder last renewed it (the server's clock).
	Renewed time.Time
}

// Read lists the leases held and the members of shares, by key.
func Read(ctx context.Context, kv jetstream.KeyValue) ([]Holding, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	var names []string
	for k := range keys.Keys() {
		if !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	_ = keys.Stop() // stopped already once listed
	slices.Sort(names)
	var out []Holding
	for _, k := range names {
		entry, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or let go meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read lease %s: %w", k, err)
		}
		var v value
		_ = json.Unmarshal(entry.Value(), &v)
		h := Holding{Role: k, Partition: -1, Process: v.Process, Epoch: v.Epoch, Renewed: entry.Created()}
		if h.Epoch == 0 {
			h.Epoch = entry.Revision()
		}
		if role, _, ok := strings.Cut(k, ".member."); ok {
			h.Role, h.Member, h.Epoch = role, true, 0
		} else if role, part, ok := strings.Cut(k, "."); ok {
			h.Role = role
			_, _ = fmt.Sscan(part, &h.Partition)
		}
		out = append(out, h)
	}
	return out, nil
}
