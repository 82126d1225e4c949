package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/lease"
	"github.com/feedproject/feed/projections/readmodel"
)

// statusReport is what `feed status` prints. A nil figure is unavailable; the
// matching error says why.
type statusReport struct {
	Stream        string            `json:"stream"`
	Head          *uint64           `json:"head"`
	HeadError     string            `json:"head_error,omitempty"`
	Projectors    []projectorStatus `json:"projectors"`
	FanoutBacklog *uint64           `json:"fanout_backlog"`
	FanoutError   string            `json:"fanout_error,omitempty"`
	// Roles are the projector roles' leases: which process is active.
	Roles      []roleStatus `json:"roles"`
	RolesError string       `json:"roles_error,omitempty"`
}

// roleStatus is which process holds a projector role's lease; for the
// appliers, the partitions each member holds.
type roleStatus struct {
	Role string `json:"role"`
	// Active is the process holding the lease (none: no process is active).
	Active string `json:"active,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
	// Partitions are, for the appliers, each member's partitions.
	Partitions map[string][]int `json:"partitions,omitempty"`
}

// projectorStatus is one projector's progress through the log.
type projectorStatus struct {
	Name string `json:"name"`
	// Position is the last log sequence the projector's output reflects.
	Position *uint64 `json:"position"`
	// Planned is, for the feeds, the planner's own position (Position is the
	// appliers'): the work up to it is planned, though perhaps not yet applied.
	Planned     *uint64  `json:"planned,omitempty"`
	Lag         *uint64  `json:"lag"`
	Rate        *float64 `json:"rate"` // events/s over the sample interval
	DeadLetters *uint64  `json:"dead_letters"`
	Error       string   `json:"error,omitempty"`
}

// streamCount is the number of messages in a stream (on subjects matching
// filter, if given); a stream that does not exist has none.
func streamCount(ctx context.Context, js jetstream.JetStream, name, filter string) (uint64, error) {
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", name, err)
	}
	if filter == "" {
		info, err := stream.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("stream %s info: %w", name, err)
		}
		return info.State.Msgs, nil
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("stream %s info for %s: %w", name, filter, err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

func ptr[T any](v T) *T { return &v }

// status prints how far each projector is behind the log.
func status(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	interval := fs.Duration("interval", time.Second, "how long to sample the rates over")
	if err := fs.Parse(args); err != nil {
		return flagError("status", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: status: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *interval <= 0 {
		return fmt.Errorf("%w: status: --interval %s must be a positive duration such as 1s", errUsage, *interval)
	}
	cfg, err := stack.Parse(getenv)
	if err != nil {
		return err
	}

	connectCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conns := stack.Connect(connectCtx, cfg)
	cancel()
	defer conns.Close()

	first := conns.Positions(ctx)
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(*interval):
	}
	last := conns.Positions(ctx)

	rep := statusReport{Stream: cfg.StreamName}
	if conns.JetStream == nil {
		rep.HeadError = "nats unavailable: " + conns.Errs["nats"]
		rep.FanoutError = rep.HeadError
	} else {
		if stream, err := conns.JetStream.Stream(ctx, cfg.StreamName); err != nil {
			rep.HeadError = fmt.Sprintf("stream %s: %v", cfg.StreamName, err)
		} else if info, err := stream.Info(ctx); err != nil {
			rep.HeadError = fmt.Sprintf("stream %s info: %v", cfg.StreamName, err)
		} else {
			rep.Head = ptr(info.State.LastSeq)
		}
		if n, err := streamCount(ctx, conns.JetStream, fanout.FanoutStream, ""); err != nil {
			rep.FanoutError = err.Error()
		} else {
			rep.FanoutBacklog = &n
		}
	}

	rep.Roles, rep.RolesError = roleStatuses(ctx, conns.JetStream, conns.Errs["nats"])

	seconds := last.At.Sub(first.At).Seconds()
	add := func(name string, pos0, pos1, planned *uint64) {
		p := projectorStatus{Name: name, Position: pos1, Planned: planned, Error: last.Errs[name]}
		if pos1 != nil && rep.Head != nil {
			p.Lag = ptr(*rep.Head - min(*pos1, *rep.Head))
		}
		if pos0 != nil && pos1 != nil && seconds > 0 {
			p.Rate = ptr(float64(*pos1-min(*pos0, *pos1)) / seconds)
		}
		if conns.JetStream != nil {
			n, err := streamCount(ctx, conns.JetStream, projections.DeadLetterStream, "deadletter."+name+".>")
			if err != nil && p.Error == "" {
				p.Error = err.Error()
			} else if err == nil {
				p.DeadLetters = &n
			}
		}
		rep.Projectors = append(rep.Projectors, p)
	}
	add(readmodel.ProjectorName, first.ReadModel, last.ReadModel, nil)
	add(fanout.PlannerName, first.Applied, last.Applied, last.Planned)
	add(activity.ProjectorName, first.Activity, last.Activity, nil)

	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printStatus(stdout, rep)
}

// roleStatuses reads the projector roles' leases (see package lease).
func roleStatuses(ctx context.Context, js jetstream.JetStream, natsErr string) ([]roleStatus, string) {
	if js == nil {
		return nil, "nats unavailable: " + natsErr
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, "" // no process has run a projector role on this server
	}
	if err != nil {
		return nil, fmt.Sprintf("lease bucket %s: %v", lease.Bucket, err)
	}
	held, err := lease.Read(ctx, kv)
	if err != nil {
		return nil, err.Error()
	}
	roles := []roleStatus{{Role: stack.RoleReadModel}, {Role: stack.RolePlanner}, {Role: stack.RoleAppliers, Partitions: map[string][]int{}}}
	for _, h := range held {
		i := slices.IndexFunc(roles, func(r roleStatus) bool { return r.Role == h.Role })
		switch {
		case i < 0:
		case h.Member:
			if _, ok := roles[i].Partitions[h.Process]; !ok {
				roles[i].Partitions[h.Process] = []int{}
			}
		case h.Partition >= 0:
			roles[i].Partitions[h.Process] = append(roles[i].Partitions[h.Process], h.Partition)
		default:
			roles[i].Active, roles[i].Epoch = h.Process, h.Epoch
		}
	}
	for _, parts := range roles[2].Partitions {
		slices.Sort(parts)
	}
	return roles, ""
}

func printStatus(w io.Writer, rep statusReport) error {
	num := func(v *uint64) string {
		if v == nil {
			return "unavailable"
		}
		return strconv.FormatUint(*v, 10)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "stream %s\thead %s\t\n", rep.Stream, num(rep.Head))
	fmt.Fprintln(tw, "PROJECTOR\tPOSITION\tPLANNED\tLAG\tRATE/S\tDEAD LETTERS\tNOTE")
	for _, p := range rep.Projectors {
		planned, rate := "-", "unavailable"
		if p.Planned != nil {
			planned = num(p.Planned)
		}
		if p.Rate != nil {
			rate = strconv.FormatFloat(*p.Rate, 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			p.Name, num(p.Position), planned, num(p.Lag), rate, num(p.DeadLetters), p.Error)
	}
	fmt.Fprintf(tw, "fan-out backlog\t%s\t%s\n", num(rep.FanoutBacklog), rep.FanoutError)
	if rep.HeadError != "" {
		fmt.Fprintf(tw, "stream\t\t%s\n", rep.HeadError)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printRoles(w, rep)
}

// printRoles prints which process is active in each projector role.
func printRoles(w io.Writer, rep statusReport) error {
	if len(rep.Roles) == 0 && rep.RolesError == "" {
		return nil // no process has run a projector role here
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nROLE\tACTIVE\tEPOCH\tPARTITIONS")
	if rep.RolesError != "" {
		fmt.Fprintf(tw, "leases\tunavailable\t\t%s\n", rep.RolesError)
	}
	for _, r := range rep.Roles {
		if r.Partitions == nil {
			active, epoch := r.Active, strconv.FormatUint(r.Epoch, 10)
			if active == "" {
				active, epoch = "none", "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\n", r.Role, active, epoch)
			continue
		}
		if len(r.Partitions) == 0 {
			fmt.Fprintf(tw, "%s\tnone\t-\t-\n", r.Role)
		}
		for _, process := range slices.Sorted(maps.Keys(r.Partitions)) {
			parts := make([]string, len(r.Partitions[process]))
			for i, p := range r.Partitions[process] {
				parts[i] = strconv.Itoa(p)
			}
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\n", r.Role, process, strings.Join(parts, ","))
		}
	}
	return tw.Flush()
}
