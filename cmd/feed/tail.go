package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/events"
)

// tailOptions is the parsed command line of `feed tail`.
type tailOptions struct {
	read    events.ReadOptions
	until   time.Time // zero: no end
	types   []string  // empty: every type
	subject string    // client-side subject filter (when --user also filters)
	limit   int       // 0: no limit
}

// listFlag is a repeatable flag whose values may also be comma lists.
type listFlag struct{ values *[]string }

func (f listFlag) String() string {
	if f.values == nil {
		return ""
	}
	return strings.Join(*f.values, ",")
}

func (f listFlag) Set(s string) error {
	for v := range strings.SplitSeq(s, ",") {
		v = strings.TrimSpace(v)
		if v == "" {
			return errors.New("empty type")
		}
		*f.values = append(*f.values, v)
	}
	return nil
}

// parseTail parses tail's flags against now.
func parseTail(args []string, now time.Time, stderr io.Writer) (tailOptions, error) {
	var o tailOptions
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	since := fs.Duration("since", 0, "start with the events stored in this last duration, e.g. 1h")
	from := fs.Uint64("from", 0, "start at this log sequence (1 is the first event)")
	isNew := fs.Bool("new", false, "start with the next event appended (the default)")
	until := fs.String("until", "", "stop at this time: RFC 3339, or a duration from now such as 10m")
	fs.Var(listFlag{&o.types}, "type", "only events of this type, e.g. post.created.v1 (repeatable, or a comma list)")
	user := fs.String("user", "", "only events caused by this user id")
	subject := fs.String("subject", "", "only events on subjects matching this filter, e.g. 'ev.*.follow.>'")
	fs.IntVar(&o.limit, "limit", 0, "stop after this many events (0: no limit)")
	if err := fs.Parse(args); err != nil {
		return o, flagError("tail", err)
	}
	usageErr := func(format string, a ...any) (tailOptions, error) {
		return tailOptions{}, fmt.Errorf("%w: tail: %s", errUsage, fmt.Sprintf(format, a...))
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	starts := 0
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "since" || f.Name == "from" || f.Name == "new" {
			starts++
		}
	})
	if starts > 1 {
		return usageErr("give at most one of --since, --from and --new")
	}
	switch {
	case isFlagSet(fs, "since"):
		if *since <= 0 {
			return usageErr("--since %s must be a positive duration such as 1h", *since)
		}
		o.read.Since = now.Add(-*since)
	case isFlagSet(fs, "from"):
		if *from == 0 {
			return usageErr("--from must be a sequence of at least 1")
		}
		o.read.FromSeq = *from
	default:
		if isFlagSet(fs, "new") && !*isNew {
			return usageErr("--new=false needs --since or --from")
		}
		o.read.New = true
	}
	if *until != "" {
		if t, err := time.Parse(time.RFC3339Nano, *until); err == nil {
			o.until = t
		} else if d, err := time.ParseDuration(*until); err == nil && d > 0 {
			o.until = now.Add(d)
		} else {
			return usageErr("--until %q is neither an RFC 3339 time nor a positive duration such as 10m", *until)
		}
	}
	if o.limit < 0 {
		return usageErr("--limit %d must not be negative", o.limit)
	}
	if *subject != "" {
		if err := validSubjectFilter(*subject); err != nil {
			return usageErr("--subject: %v", err)
		}
	}
	switch {
	case *user != "":
		id, err := strconv.ParseInt(*user, 10, 64)
		if err != nil || id <= 0 {
			return usageErr("--user %q is not a user id", *user)
		}
		o.read.Filters = []string{fmt.Sprintf("%s.%d.>", events.SubjectPrefix, id)}
		o.subject = *subject
	case *subject != "":
		o.read.Filters = []string{*subject}
	}
	o.read.IncludeUnknown = true
	return o, nil
}

// flagError makes a flag parse error a usage error; --help stays as it is.
func flagError(cmd string, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", errUsage, cmd, err)
}

func isFlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// validSubjectFilter checks a NATS subject filter: non-empty tokens, '>' only last.
func validSubjectFilter(s string) error {
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		switch {
		case t == "" || strings.ContainsAny(t, " \t\r\n"):
			return fmt.Errorf("%q is not a subject filter", s)
		case t == ">" && i != len(tokens)-1:
			return fmt.Errorf("%q: '>' must be the last token", s)
		case t != "*" && t != ">" && strings.ContainsAny(t, "*>"):
			return fmt.Errorf("%q: a wildcard must be a whole token", s)
		}
	}
	return nil
}

// subjectMatches reports whether subject matches a NATS filter with * and >.
func subjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) || (f != "*" && f != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}

// tailLine is one printed event: the envelope plus its place in the log.
type tailLine struct {
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	events.Envelope
}

// errTailDone ends a tail that reached --until or --limit.
var errTailDone = errors.New("tail done")

// tail prints the events of the log that match its flags as JSON lines. It
// reads with an ephemeral ordered consumer and leaves no state on the server.
func tail(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	opts, err := parseTail(args, time.Now(), stderr)
	if err != nil {
		return err
	}
	cfg, err := stack.Parse(getenv)
	if err != nil {
		return err
	}
	url := cfg.NATSEndpoint()
	nc, err := nats.Connect(url, nats.Name("feed tail"))
	if err != nil {
		return fmt.Errorf("connect nats %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	log, err := events.AttachLog(ctx, js, events.Config{Name: cfg.StreamName}, events.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		return err
	}
	defer log.Close()

	if !opts.until.IsZero() {
		if time.Now().Before(opts.until) {
			// Ends a tail that sees no event after --until.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, opts.until)
			defer cancel()
		} else {
			// Only the past is wanted: what is stored now is all there is.
			opts.read.StopAtEnd = true
		}
	}
	enc := json.NewEncoder(stdout)
	printed := 0
	err = log.Read(ctx, opts.read, func(rec events.Record) error {
		if !opts.until.IsZero() && rec.OccurredAt.After(opts.until) {
			return errTailDone
		}
		if opts.subject != "" && !subjectMatches(opts.subject, rec.Subject) {
			return nil
		}
		if len(opts.types) > 0 && !slices.Contains(opts.types, rec.Type) {
			return nil
		}
		if err := enc.Encode(tailLine{Seq: rec.Seq, Subject: rec.Subject, Envelope: rec.Envelope}); err != nil {
			return fmt.Errorf("write event %d: %w", rec.Seq, err)
		}
		printed++
		if opts.limit > 0 && printed >= opts.limit {
			return errTailDone
		}
		return nil
	})
	if errors.Is(err, errTailDone) {
		return nil
	}
	return err
}
