package lease

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"
)

// memberKey is the key of a member of role's share, which it keeps while it
// runs: the bucket's age limit removes a member that stopped renewing it.
func memberKey(role, member string) string { return role + ".member." + member }

// partitionKey is the lease of one partition of role.
func partitionKey(role string, part int) string { return role + "." + strconv.Itoa(part) }

// held is a partition this process holds, and its work.
type held struct {
	term
	stop func()
	done chan struct{}
	// leaving: asked to stop, for another member to take the partition; it
	// is renewed until its work has returned, then let go.
	leaving bool
	// lost: no longer renewed; forgotten once its work has returned.
	lost bool
}

// Share runs work for a share of the partitions 0..partitions-1 of role,
// until ctx ends, with every other process that runs Share for role: each
// partition is a lease of its own, held by at most one process at a time,
// and the processes divide the partitions evenly among themselves (the
// members listed in the bucket, in the order of their keys, take the
// partitions in turn). A process that joins or leaves changes the division
// within a tick: a partition that moves is stopped (work returns) and let
// go first, and the next owner takes it then. work gets the partition, and
// a context that ends when it is to stop.
func (l *Leases) Share(ctx context.Context, role string, partitions int, work func(ctx context.Context, part int)) error {
	mine := map[int]*held{}
	l.setState(role, RoleState{State: Standby})
	defer func() {
		for _, h := range mine {
			h.stop()
		}
		for _, h := range mine {
			<-h.done
			if !h.lost {
				l.release(ctx, &h.term)
			}
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.tick)
		defer cancel()
		_ = l.kv.Delete(dctx, memberKey(role, l.member))
		l.setState(role, RoleState{State: Standby})
	}()
	tick := time.NewTicker(l.tick)
	defer tick.Stop()
	for {
		members := l.members(ctx, role)
		want := map[int]bool{}
		if i := slices.Index(members, l.member); i >= 0 {
			for p := i; p < partitions; p += len(members) {
				want[p] = true
			}
		}
		for p, h := range mine {
			select {
			case <-h.done:
				if !h.lost {
					l.release(ctx, &h.term)
				}
				delete(mine, p)
				continue
			default:
			}
			if h.lost {
				continue
			}
			if !l.renew(ctx, &h.term) {
				l.metrics.lost(role)
				l.logger.Warn("partition lost", "role", role, "partition", p, "epoch", h.epoch)
				h.lost = true
				h.stop()
				continue
			}
			if !want[p] && !h.leaving {
				l.logger.Info("partition moves to another process", "role", role, "partition", p)
				h.leaving = true
				h.stop()
			}
		}
		for p := range partitions {
			if _, ok := mine[p]; ok || !want[p] || ctx.Err() != nil {
				continue
			}
			t, _, err := l.tryAcquire(ctx, partitionKey(role, p))
			if err != nil {
				if !errors.Is(err, errHeld) && ctx.Err() == nil {
					l.logger.Warn("cannot try for a partition", "role", role, "partition", p, "err", err)
				}
				continue
			}
			l.metrics.tookOver(role)
			l.logger.Info("partition taken", "role", role, "partition", p, "epoch", t.epoch)
			pctx, stop := context.WithCancel(ctx)
			h := &held{term: *t, stop: stop, done: make(chan struct{})}
			go func() {
				defer close(h.done)
				work(pctx, p)
			}()
			mine[p] = h
		}
		var parts []int
		for p, h := range mine {
			if !h.leaving && !h.lost {
				parts = append(parts, p)
			}
		}
		slices.Sort(parts)
		state := RoleState{State: Standby, Partitions: parts, Members: len(members)}
		if len(parts) > 0 {
			state.State = Active
		}
		l.setState(role, state)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// members renews this process's membership of role's share and lists the
// members, sorted; this process among them even when the bucket cannot be
// reached (it then holds only what it can renew).
func (l *Leases) members(ctx context.Context, role string) []string {
	ctx, cancel := context.WithTimeout(ctx, l.tick)
	defer cancel()
	if _, err := l.kv.Put(ctx, memberKey(role, l.member), l.value(0)); err != nil {
		if ctx.Err() == nil {
			l.logger.Warn("cannot renew membership", "role", role, "err", err)
		}
	}
	members := []string{l.member}
	keys, err := l.kv.ListKeysFiltered(ctx, memberKey(role, ">"))
	if err == nil {
		prefix := memberKey(role, "")
		for k := range keys.Keys() {
			if m, ok := strings.CutPrefix(k, prefix); ok && !slices.Contains(members, m) {
				members = append(members, m)
			}
		}
		_ = keys.Stop()
	}
	slices.Sort(members)
	return members
}
