package loadbench

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"time"
)

// WriteMarkdown writes the report as Markdown tables.
func (r *Report) WriteMarkdown(w io.Writer) error {
	s := r.Summary()
	var b strings.Builder
	r.mdHeader(&b)
	r.mdSetup(&b)
	mdRaw(&b, s.Raw)
	r.mdCommands(&b, s)
	r.mdFreshness(&b, s)
	mdFeed(&b, s)
	r.mdProjectors(&b, s)
	r.mdResources(&b, s)
	r.mdScale(&b, s)
	mdRatios(&b, s)
	mdTargets(&b, s)
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func (r *Report) mdHeader(b *strings.Builder) {
	c := r.Config
	fmt.Fprintf(b, "# feedbench, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 MST"))
	if r.CommandLine != "" {
		fmt.Fprintf(b, "```\n%s\n```\n\n", r.CommandLine)
	}
	fmt.Fprintf(b, "- Machine: %d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	for _, n := range r.MachineNotes {
		fmt.Fprintf(b, "; %s", n)
	}
	fmt.Fprintf(b, ".\n")
	fmt.Fprintf(b, "- Service: %s.\n", r.Stack)
	fmt.Fprintf(b, "- Graph: %d users, %d followers on average, %d big accounts above %d followers (seed %d).\n",
		c.Users, c.AvgFollowers, c.BigAccounts, c.BigThreshold, c.Seed)
	fmt.Fprintf(b, "- Mixed phase: %s after a %s warm-up, open loop: %.0f posts/s (one %d×%d PNG each; %.0f %% by big accounts), %.0f follows+unfollows/s, "+
		"%.0f likes/s, %.0f comments/s, %.0f feed reads/s (%.0f %% of them the next page). Read phase: %s of %.0f first pages/s, after every user's first page was read once, unrecorded.\n",
		c.Duration, c.Warmup, c.PostRate, c.ImageSide, c.ImageSide, 100*c.BigPostShare, c.FollowRate, c.LikeRate, c.CommentRate, c.ReadRate,
		100*c.NextPageShare, c.ReadDuration, c.CachedReadRate)
	fmt.Fprintf(b, "- Latency is from each request's intended send time (constant arrival rate) to its answer, so a stall counts "+
		"for every request it delays; the bench shares the machine with the service.\n")
	fmt.Fprintf(b, "- Run took %s.\n\n", r.Finished.Sub(r.Started).Round(time.Second))
}

func (r *Report) mdSetup(b *strings.Builder) {
	st := r.Setup
	fmt.Fprintf(b, "## Setup\n\n")
	fmt.Fprintf(b, "%d follows in %s (%.0f/s, %d failed); every inbox materialised in %s (%d passes of reads).\n\n",
		st.Follows, fmtDuration(st.FollowTime), float64(st.Follows)/max(st.FollowTime.Seconds(), 1e-9), st.FollowErrors,
		fmtDuration(st.MaterialiseTime), st.MaterialisePasses)
}

func mdRaw(b *strings.Builder, raw RawLimits) {
	fmt.Fprintf(b, "## Raw limits (same machine, same run, same servers)\n\n")
	fmt.Fprintf(b, "| limit | per second |\n|---|---:|\n")
	fmt.Fprintf(b, "| Redis `ZADD`, pipelined %d at a time from %d clients | %s |\n", rawChunk, rawWorkers, fmtRate(raw.ZAdd))
	fmt.Fprintf(b, "| JetStream async publish, %d B messages with ids, scratch stream | %s |\n", rawMsgSize, fmtRate(raw.Publish))
	fmt.Fprintf(b, "| JetStream ordered consumer read | %s |\n\n", fmtRate(raw.Consume))
	fmt.Fprintf(b, "The scratch stream is stored as the server stores the log: under `sync always` each of its async publishes is "+
		"synced on its own, while the service's group commit shares one sync among the appends that arrive together.\n\n")
	for _, n := range raw.Notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
	if len(raw.Notes) > 0 {
		b.WriteString("\n")
	}
}

func (r *Report) mdCommands(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## Commands (mixed phase)\n\n")
	fmt.Fprintf(b, "| command | target/s | answered 202/s | errors | p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, k := range s.Commands {
		fmt.Fprintf(b, "| `%s` | %s | %.1f | %d | %s | %s | %s |\n", k.Kind, fmtRate(k.Target), k.Rate, k.Errors,
			fmtDuration(k.P50), fmtDuration(k.P99), fmtDuration(k.Max))
	}
	fmt.Fprintf(b, "| all | %.0f | %.1f | | | | |\n\n", r.Config.PostRate+r.Config.FollowRate+r.Config.LikeRate+r.Config.CommentRate, s.CommandRate)
	for _, k := range s.Commands {
		for _, e := range k.ErrorsExamples {
			fmt.Fprintf(b, "- `%s`: %s\n", k.Kind, e)
		}
	}
	fmt.Fprintf(b, "Unfollows undo earlier follows of the workload; follows pick pairs outside the generated graph.\n\n")
}

func (r *Report) mdFreshness(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## Feed freshness (mixed phase)\n\n")
	fmt.Fprintf(b, "From a post's `202` to the first answer of `GET /feed` by one of its followers that shows it, polled "+
		"%s, at most %.0f posts/s of each kind of author and %d followers each.\n\n",
		pollScheduleText(), r.Config.FreshRate, r.Config.FreshFollowers)
	fmt.Fprintf(b, "| authors | samples | not seen in %s | p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n", fmtDuration(r.Config.FreshTimeout))
	for _, f := range s.Fresh {
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s |\n", f.Authors, f.Samples, f.Missed, fmtDuration(f.P50), fmtDuration(f.P99), fmtDuration(f.Max))
	}
	fmt.Fprintf(b, "\nThe poller read %.0f pages/s (its `GET /feed`s, on top of the workload's).\n\n", r.PollRate())
	r.mdStreams(b, s)
}

func (r *Report) mdStreams(b *strings.Builder, s Summary) {
	st := r.Streams
	if st.Viewers == 0 {
		return
	}
	fmt.Fprintf(b, "## Live streams (mixed phase)\n\n")
	secs := (r.Config.Warmup + r.Config.Duration).Seconds()
	fmt.Fprintf(b, "%d users held a `GET /stream` open through the warm-up and the mixed phase; they read %d post events "+
		"(%.0f/s), and %d streams ended and were resumed. Announcement: from a post's `202` to its event read from a follower's stream.\n\n",
		st.Viewers, st.Events, float64(st.Events)/secs, st.Reconnects)
	fmt.Fprintf(b, "| authors | announcements | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n")
	for _, a := range s.Announce {
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s |\n", a.Authors, a.Samples, fmtDuration(a.P50), fmtDuration(a.P99), fmtDuration(a.Max))
	}
	fmt.Fprintf(b, "\nInbox writes, from the service's `feed_inbox_freshness_seconds` (an event's time to its work applied, "+
		"per work message; online recipients' work is published first):\n\n| recipients | p50 bucket | p99 bucket |\n|---|---:|---:|\n")
	for _, f := range s.Inboxes {
		fmt.Fprintf(b, "| %s | %s | %s |\n", f.Recipients, f.P50, f.P99)
	}
	fmt.Fprintln(b)
}

func mdFeed(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## `GET /feed`\n\n")
	fmt.Fprintf(b, "| phase | target/s | read/s | errors | p50 | p99 | max | service p99 bucket | bench late p50 / p99 | pages: cache | mixed | Postgres (fallbacks) | hit ratio |\n")
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range s.Feed {
		fmt.Fprintf(b, "| %s | %.0f | %.1f | %d | %s | %s | %s | %s | %s / %s | %.0f | %.0f | %.0f | %.1f %% |\n", f.Phase, f.Target, f.Rate, f.Errors,
			fmtDuration(f.P50), fmtDuration(f.P99), fmtDuration(f.Max), f.ServerP99Bucket, fmtDuration(f.LateP50), fmtDuration(f.LateP99),
			f.Cache, f.Mixed, f.Postgres, 100*f.HitRatio)
	}
	fmt.Fprintf(b, "\nPages by source are the service's `feed_home_pages_total` over the phase (the mixed phase's include the freshness "+
		"poller's reads); `mixed` pages ran past the inbox into Postgres. The service p99 bucket is from its own `feed_http_request_seconds`. "+
		"*Bench late* is how long after its intended time the load generator started each of the phase's requests (every kind): "+
		"a delay of the bench's own (its timers, its goroutines waiting for a CPU), which every latency it records includes.\n\n")
	fmt.Fprintf(b, "Reads slower than %s, by the %s windows of their send times (a few crowded windows are stalls; many, a queue):\n\n",
		fmtDuration(slowRead), fmtDuration(slowWindow))
	for _, f := range s.Feed {
		sr := f.Slow
		if sr.Reads == 0 {
			continue
		}
		fmt.Fprintf(b, "- %s: %d of %d (%.2f %%), in %d of %d windows", f.Phase, sr.Slow, sr.Reads, 100*float64(sr.Slow)/float64(sr.Reads), sr.Windows, sr.All)
		if sr.Worst > 0 {
			fmt.Fprintf(b, "; the worst held %d of its %d reads", sr.Worst, sr.WorstReads)
		}
		fmt.Fprintf(b, ".\n")
	}
	fmt.Fprintf(b, "\n")
}

func (r *Report) mdProjectors(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## Projectors\n\n")
	fmt.Fprintf(b, "| projector | mean applied/s (mixed) | peak applied/s (run) | max lag (mixed) | lag at its end | batches (mixed) | mean batch | events/batch | delay p50 | delay p99 |\n")
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range s.Projectors {
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %.1f | %s | %s |\n", p.Name, p.MeanRate, p.PeakRate, p.LagMax, p.LagEnd,
			p.Batches, fmtDuration(p.MeanBatch), p.EventsPerBatch, p.DelayP50, p.DelayP99)
	}
	fmt.Fprintf(b, "\nBatches are the service's `feed_projector_batch_seconds` (for the feeds, the planner's: events planned "+
		"and their work published). Delays are the buckets of its `feed_projector_delay_seconds` that hold the quantile: "+
		"from an event's occurrence (before its commit) to its effect, for the feeds in the inboxes (per work message, "+
		"from its oldest event).\n")
	if f := s.Fanout; f.Known {
		perMsg := 0.0
		if f.MessagesPerSec > 0 {
			perMsg = s.FanoutRate / f.MessagesPerSec
		}
		fmt.Fprintf(b, "\nInside the feeds projector (mixed phase): the planner's lag at most %.0f events (%.0f at the end); "+
			"it published %.0f work messages/s (about %.0f inbox writes each, if it kept up), of which at most %.0f (%.0f at the end) "+
			"waited for the appliers.", f.PlannerLagMax, f.PlannerLagEnd, f.MessagesPerSec, perMsg, f.BacklogMax, f.BacklogEnd)
	}
	if stages := s.Fanout.Stages; len(stages) > 0 {
		parts := make([]string, len(stages))
		for i, st := range stages {
			parts[i] = st.Name + " " + fmtDuration(st.Mean)
		}
		fmt.Fprintf(b, "\n\nWhere a planner batch's time went, mean per batch (`feed_projector_stage_seconds`): %s. "+
			"*lock* waits for warm-ups; *read* is the planner's state and the batch's graph facts, one round trip; *changes* "+
			"the graph and outbox changes with the followers read, one round trip; *plan* making the work; *publish* until "+
			"the log stored it; *position* storing the planner's; *wait* for the appliers.", strings.Join(parts, ", "))
	}
	if a := s.Fanout.Appliers; a.Known {
		fmt.Fprintf(b, "\n\nWhere an applier's message went, mean per message (`feed_projector_stage_seconds{projector=\"feeds-appliers\"}`): "+
			"waiting for it %s (idle time included), applying it %s, in %.1f round trips to Redis of %s each.",
			fmtDuration(a.Fetch), fmtDuration(a.Apply), a.RoundsPerMessage, fmtDuration(a.Round))
	}
	if f := s.Fanout; f.RepairsKnown {
		fmt.Fprintf(b, "\n\nThe service's maintenance round repaired %.0f inbox entries in the mixed phase (`feed_inbox_repairs_total`: "+
			"ghosts, missing posts, over-long inboxes; zero in a correct system).", f.Repairs)
	}
	b.WriteString("\n")
	if r.DrainError != "" {
		fmt.Fprintf(b, "\nAfter the mixed phase the projectors did **not** catch up: %s.\n\n", r.DrainError)
	} else {
		fmt.Fprintf(b, "\nAfter the mixed phase both projectors had applied everything up to position %d within %s.\n\n",
			r.DrainPosition, fmtDuration(r.Drain))
	}
}

// mdScale is what a unit of work cost: the figures to compare between runs
// of different graph sizes.
func (r *Report) mdScale(b *strings.Builder, s Summary) {
	perUnit := func(v float64) string {
		if v < 0 {
			return "unknown"
		}
		return fmt.Sprintf("%.0f B", v)
	}
	fmt.Fprintf(b, "## Cost per unit of work (%d users)\n\n", r.Config.Users)
	fmt.Fprintf(b, "| figure | value |\n|---|---:|\n")
	fmt.Fprintf(b, "| fan-out inbox entries/s asked by the mixed phase's posts | %.0f |\n", s.FanoutRate)
	fmt.Fprintf(b, "| Redis memory per materialised user, graph built and inboxes warm, before any post | %s |\n", perUnit(s.Scale.RedisPerUser))
	fmt.Fprintf(b, "| Postgres database growth per event of the warm-up and mixed phase, once applied | %s |\n\n", perUnit(s.Scale.PostgresPerEvent))
	fmt.Fprintf(b, "Redis' is the growth of its `used_memory` without its clients' buffers (which follow the connections open, not the data) from before the graph to the end of the materialisation, over the users; Postgres' "+
		"from the mixed phase's start until the projectors drained it, over the log positions in between. With the same "+
		"rates and followers on average they should not grow with the graph.\n\n")
}

func (r *Report) mdResources(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## Resources (mixed phase: mean of its first and last quarter)\n\n")
	fmt.Fprintf(b, "| resource | start | end | growth/min |\n|---|---:|---:|---:|\n")
	for _, rs := range s.Resources {
		growth := "unknown"
		if rs.Start >= 0 && rs.End >= 0 {
			growth = fmtBytes(int64(math.Abs(rs.GrowthPerMin)))
			if rs.GrowthPerMin < 0 {
				growth = "−" + growth
			}
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", rs.Name, fmtBytes(rs.Start), fmtBytes(rs.End), growth)
	}
	fmt.Fprintf(b, "\nRedis grows until inboxes and outboxes reach their caps; Postgres keeps every post. The NATS server's "+
		"resident memory (a process of its own, `feed nats`, when the service started it) holds JetStream's indexes and caches, "+
		"which grow with the log. The service's Go heap in use swings between what is live and several times that (GOGC); "+
		"what its last collection found live (`go_gc_heap_live_bytes`) and its resident memory are what the memory target reads. "+
		"Its caches of posts, like states and pages fill up to their bounds in the first minutes at these rates: "+
		"a soak that is to show a flat heap starts after a warm-up (`--warmup`).\n\n")
	cores := func(v float64) string {
		if v < 0 {
			return "unknown"
		}
		return fmt.Sprintf("%.2f", v)
	}
	fmt.Fprintf(b, "CPU, mean cores used (of %d), and how long goroutines of the bench's process waited to run once runnable:\n\n", runtime.NumCPU())
	fmt.Fprintf(b, "| phase | machine | of it in the kernel | stolen | DAMON | feed process | Redis | Postgres | NATS | bench | anything else | goroutines | run-queue wait p50 | p99 | the service's p99 bucket |\n")
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range s.CPU {
		bench := cores(c.Bench)
		damon := cores(c.DAMON)
		if c.DAMON < 0 {
			damon = "none"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s |\n", c.Phase, cores(c.Machine), cores(c.Kernel),
			cores(c.Steal), damon, cores(c.Process), cores(c.Redis),
			cores(c.Postgres), cores(c.NATS), bench, cores(c.other()), c.Goroutines, fmtDuration(c.SchedP50), fmtDuration(c.SchedP99), c.ServiceSchedP99)
	}
	fmt.Fprintf(b, "\nThe service's p99 bucket is of its own `go_sched_latencies_seconds` (coarse buckets, a decade apart). "+
		"The feed process is the service. "+
		"NATS runs as a child process of the service (`feed nats`), in its own column; it is unknown when the service uses "+
		"an external NATS_URL, and then counted in *anything else*. "+
		"*Stolen* is time the hypervisor gave the machine's CPUs to something else while they had work (`/proc/stat`'s steal, not in *machine*): "+
		"the service's threads waited for it. *DAMON* is the kernel's DAMON monitors' threads (`kdamond`, in *machine*), whose sampling took "+
		"the CPU from the service in bursts. "+
		"Redis runs commands on one thread. *Bench* is the bench's own process (the load generator, the freshness poller, "+
		"the sampler). *Anything else* is other work on the machine, which the figures above shared it with. "+
		"A large share in the kernel can be the machine's own state: on an ext4 without a journal, files created "+
		"within minutes of many removals (an earlier run's data) cost far more.\n\n")
	if d := s.Disturbed; d.Known > 0 {
		fmt.Fprintf(b, "Other work on the machine (*anything else*, over %d s) took %.2f of a core or more for %d s of the mixed phase's %d s "+
			"(at most %.2f): the service's figures from those seconds were measured on a busier machine (the chart's CPU panel shows when).\n\n",
			disturbedWindow, disturbedCores, d.Seconds, d.Known, d.Peak)
	}
}

// other is the phase's mean of Sample.OtherCPU.
func (c CPUSummary) other() float64 {
	return Sample{MachineCPU: c.Machine, ProcessCPU: c.Process, RedisCPU: c.Redis, PostgresCPU: c.Postgres,
		NATSCPU: c.NATS, BenchCPU: c.Bench, DAMONCPU: c.DAMON}.OtherCPU()
}

func mdRatios(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## The service against the raw limits\n\n")
	fmt.Fprintf(b, "| service | /s | raw limit | /s | ratio |\n|---|---:|---|---:|---:|\n")
	for _, x := range s.Ratios {
		ratio := "—"
		if x.LimitRate > 0 {
			ratio = fmt.Sprintf("%.3f", x.Ratio)
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s |\n", x.Service, x.ServiceRate, x.Limit, fmtRate(x.LimitRate), ratio)
	}
	b.WriteString("\n")
}

func mdTargets(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "## Targets\n\n| target | measured | met |\n|---|---|---|\n")
	for _, t := range s.Targets {
		met := "**no**"
		if t.Met {
			met = "yes"
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", t.Target, t.Measured, met)
	}
	b.WriteString("\n")
}
