package stack

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is everything the service reads from its environment, parsed once here.
// The README's configuration table lists the same variables and defaults.
type Config struct {
	HTTPAddr        string
	DataDir         string
	JWTSecret       string
	NodeID          int
	Roles           []string
	LogLevel        slog.Level
	LogFormat       string
	ShutdownTimeout time.Duration
	ConsistencyWait time.Duration
	// LeaseTTL is how long a projector role's lease outlives its holder's
	// last renewal (FEED_LEASE_TTL).
	LeaseTTL time.Duration
	// ResumeWindow is how far back a stream resumes (FEED_RESUME_WINDOW).
	ResumeWindow time.Duration

	NATSURL     string
	RedisURL    string
	DatabaseURL string
	// RedisReplicaAcks is how many replicas each projector write to Redis
	// waits for (FEED_REDIS_REPLICA_ACKS); -1 when unset: 1 on a cluster,
	// 0 on one server (see RedisReplicaAcksFor).
	RedisReplicaAcks int

	// The NATS server started when NATSURL is empty (feed nats).
	NATSPort     int
	NATSSync     string // "always" or a Go duration
	StreamName   string
	Replicas     int
	DedupWindow  time.Duration
	DevRedisPort int
	// DevRedisRealtime is the SCHED_FIFO priority of dev's Redis (0: none).
	DevRedisRealtime int
	DevPGPort        int

	InboxCap, OutboxCap, BigAccount, Partitions int
	// PostCache is how many hydrated posts the API keeps (0: none).
	PostCache int
	// PageCache is how many home feed pages the API keeps (0: none).
	PageCache int
	// MaintenanceRate is the inboxes checked per second (FEED_MAINTENANCE_RATE).
	MaintenanceRate int
	// ActivityKeep is how many items a user's activity keeps at least
	// (FEED_ACTIVITY_KEEP).
	ActivityKeep int
	InboxTTL     time.Duration

	// MediaGrace is how long an image is kept after its last upload and
	// after the deletion of the post that showed it (FEED_MEDIA_GRACE).
	MediaGrace time.Duration
	// MediaCollectInterval is how often unreferenced images are collected;
	// 0: only when asked (FEED_MEDIA_COLLECT_INTERVAL).
	MediaCollectInterval time.Duration
	// MediaStore is where images live: MediaPack or MediaObjectStore
	// (FEED_MEDIA_STORE).
	MediaStore string

	// Web is FEED_WEB: "" (the web page in dev only), "1" (in serve too) or
	// "0" (nowhere); see ServesWebPage.
	Web string
}

// ServesWebPage reports whether the api role serves the web page at /: in
// development mode unless FEED_WEB=0, and in serve only with FEED_WEB=1.
func (c Config) ServesWebPage(dev bool) bool {
	return c.Web == "1" || (dev && c.Web == "")
}

// The media stores FEED_MEDIA_STORE names.
const (
	MediaPack        = "pack"        // packs under FEED_DATA_DIR/media, one process's
	MediaObjectStore = "objectstore" // JetStream's Object Store, shared by every replica
)

// minMediaGrace is the shortest FEED_MEDIA_GRACE: it must exceed the longest
// time from an image's upload to its post's append (the request's read
// timeout and the append's), which a shorter grace would not cover.
const minMediaGrace = 5 * time.Minute

// DevJWTSecret signs and checks tokens in dev mode when FEED_JWT_SECRET is
// unset, so `feed token` works against `feed dev` with no setup. Never for
// production: serve refuses to start without a secret of its own.
const DevJWTSecret = "feed-development-secret-not-for-production"

// TokenSecret returns the secret to use; dev allows the development default.
func (c Config) TokenSecret(dev bool) (string, error) {
	switch {
	case c.JWTSecret != "":
		return c.JWTSecret, nil
	case dev:
		return DevJWTSecret, nil
	default:
		return "", errors.New("FEED_JWT_SECRET must be set for serve (at least 16 bytes)")
	}
}

// The roles a process can run. Every process serves /healthz, /readyz and
// /metrics; RoleAPI adds the contract's routes.
const (
	RoleAPI       = "api"
	RoleReadModel = "readmodel" // the Postgres read model projector
	RolePlanner   = "planner"   // the feed projector's first stage
	RoleAppliers  = "appliers"  // the feed projector's second stage (a share of the partitions)
	RoleActivity  = "activity"  // the activity projector (Postgres)
)

var knownRoles = []string{RoleAPI, RoleReadModel, RolePlanner, RoleAppliers, RoleActivity}

// Variable is one documented environment variable.
type Variable struct {
	Name, Default, Help string
}

// Variables is the configuration table, in README order.
var Variables = []Variable{
	{"FEED_HTTP_ADDR", ":8080", "HTTP listen address."},
	{"FEED_DATA_DIR", ".data", "Data directory: the NATS store (when NATS_URL is unset), media, and in dev mode Redis and Postgres data."},
	{"FEED_JWT_SECRET", "", "HS256 secret for bearer tokens, at least 16 bytes; required by `serve`. `dev` and `token` use a fixed development secret when it is unset."},
	{"FEED_ROLES", "api,readmodel,planner,appliers,activity", "Comma-separated roles this process runs (`--roles` overrides): `api`, `readmodel` (the Postgres projector), `planner` and `appliers` (the two stages of the Redis feed projector), `activity` (the activity projector, Postgres). A projector role may run in several processes: one is active and the others stand by (`readmodel`, `planner`, `activity`), or they share the partitions (`appliers`)."},
	{"FEED_INBOX_CAP", "500", "Posts kept per home feed inbox in Redis: the newest, and up to 100 more before a trim."},
	{"FEED_OUTBOX_CAP", "500", "Posts kept per author outbox in Redis."},
	{"FEED_INBOX_TTL", "168h", "Inboxes of users who have not read their feed for this long expire and stop receiving pushes."},
	{"FEED_BIG_ACCOUNT", "10000", "Authors with more followers than this are not pushed; their posts are merged into pages at read time. An author stays so until its followers fall to nine tenths of it, so that one followed and unfollowed at the threshold does not have its outbox merged into every follower's inbox each time."},
	{"FEED_PARTITIONS", "4", "Applier partitions of the feed projector (by recipient)."},
	{"FEED_POST_CACHE", "100000", "Hydrated posts the API keeps in memory for GET /feed (about 1 KiB each), kept current by following the log; 0 hydrates every page from Postgres."},
	{"FEED_PAGE_CACHE", "50000", "Home feed pages the API keeps in memory (about 400 bytes each), kept current by Redis's client-side caching invalidations; 0 reads every page from Redis."},
	{"FEED_ACTIVITY_KEEP", "1000", "Items of a user's activity kept at least: the newest; older ones are trimmed once a tenth as many more have come."},
	{"FEED_MAINTENANCE_RATE", "2", "Inboxes the maintenance round checks per second (each check reads every followee's outbox and holds the feed planner meanwhile)."},
	{"FEED_MEDIA_GRACE", "1h", "Images are kept at least this long after their last upload, and after the post that showed them was deleted; older ones no post references are removed. At least 5m."},
	{"FEED_MEDIA_COLLECT_INTERVAL", "1h", "How often the api role removes the images no post references and compacts the media packs; 0 only on `POST /admin/media/collect`."},
	{"FEED_MEDIA_STORE", "pack", "Where the api role keeps images: `pack` (files under FEED_DATA_DIR/media, which one process at a time opens) or `objectstore` (the JetStream Object Store bucket FEED_MEDIA, replicated like the event stream, which every API replica shares)."},
	{"FEED_WEB", "", "The web page at `/`, a client of the public API for trying the service in a browser: unset serves it in `dev` only, `1` in `serve` too, `0` nowhere. `dev` adds its development sign-in (`POST /dev/token`, a token for any user id), which answers 403 when FEED_JWT_SECRET is set; `serve` never has it."},
	{"FEED_NODE_ID", "0", "This process's node number in post and comment ids, 0–255: unique per API replica."},
	{"FEED_LOG_LEVEL", "info", "debug, info, warn or error."},
	{"FEED_LOG_FORMAT", "text", "text or json."},
	{"FEED_SHUTDOWN_TIMEOUT", "20s", "How long shutdown waits for in-flight work."},
	{"FEED_CONSISTENCY_WAIT", "2s", "Longest wait of a read for X-Min-Position."},
	{"FEED_LEASE_TTL", "5s", "How long a projector role's lease (in the JetStream bucket FEED_LEASES) outlives the last renewal of the process holding it: a standby takes over about this and a second after the active process dies. The same in every process; at least 1s."},
	{"FEED_RESUME_WINDOW", "10m", "How far back GET /stream resumes from a Last-Event-ID; an older position gets a reset."},
	{"FEED_NATS_PORT", "4222", "Loopback client port of the NATS server started when NATS_URL is unset (so the nats CLI connects with no flags); 0 picks a free one."},
	{"FEED_NATS_SYNC", "always", "That server's JetStream fsync policy: always (acknowledged = on disk) or an interval such as 2m."},
	{"FEED_STREAM", "FEED_EVENTS", "Name of the event stream."},
	{"FEED_REDIS_REPLICA_ACKS", "", "How many replicas of the Redis node that takes a projector's write must have it before the write counts as done (Redis's WAIT), so that a master lost in a failover takes no acknowledged inbox or follow with it. Unset: 1 on a Redis Cluster, 0 on one server. A node whose replicas do not answer within 1 s is written to without waiting for 5 s, and `feed_redis_replica_acks_short_total` counts it; set 0 on a cluster without replicas."},
	{"FEED_STREAM_REPLICAS", "", "Replicas of every stream the service creates (3 on a JetStream cluster); unset keeps an existing stream's and creates new ones with 1. Only serve and dev apply it; tools never change a stream."},
	{"FEED_DEDUP_WINDOW", "10m", "How long an Idempotency-Key / event id is remembered."},
	{"FEED_DEV_REDIS_PORT", "16379", "dev: loopback port of the child Redis."},
	{"FEED_DEV_REDIS_REALTIME", "0", "dev: realtime priority (SCHED_FIFO, 1–99) of the child Redis's command thread, so that it runs whenever it has work on a machine whose cores are all busy; needs root or `CAP_SYS_NICE`. 0 leaves it under the default policy (at niceness −5 where allowed)."},
	{"FEED_DEV_POSTGRES_PORT", "15432", "dev: loopback port of the child Postgres."},
	{"NATS_URL", "", "External NATS server or cluster; unset starts one as a child process (feed nats)."},
	{"REDIS_URL", "", "External Redis; unset in dev mode starts a child redis-server. A Redis Cluster: redis://host1:port1?addr=host2:port2&addr=host3:port3."},
	{"DATABASE_URL", "", "External Postgres; unset in dev mode starts a child postgres."},
}

// Parse reads the configuration from getenv, with the table's defaults, and
// says everything wrong with it at once.
func Parse(getenv func(string) string) (Config, error) {
	get := func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		for _, v := range Variables {
			if v.Name == name {
				return v.Default
			}
		}
		panic("undocumented variable " + name) // a programming error, caught by tests
	}
	var errs []string
	duration := func(name string) time.Duration {
		d, err := time.ParseDuration(get(name))
		if err != nil || d < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a duration such as 2s", name, get(name)))
		}
		return d
	}
	integer := func(name string, lo, hi int) int {
		n, err := strconv.Atoi(get(name))
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Sprintf("%s=%q is not an integer in [%d, %d]", name, get(name), lo, hi))
		}
		return n
	}
	// optional is 0 for a variable that is unset and has no default.
	optional := func(parse func(string, int, int) int, name string, lo, hi int) int {
		if get(name) == "" {
			return 0
		}
		return parse(name, lo, hi)
	}
	cfg := Config{
		HTTPAddr:         get("FEED_HTTP_ADDR"),
		DataDir:          get("FEED_DATA_DIR"),
		JWTSecret:        get("FEED_JWT_SECRET"),
		LogFormat:        get("FEED_LOG_FORMAT"),
		ShutdownTimeout:  duration("FEED_SHUTDOWN_TIMEOUT"),
		ConsistencyWait:  duration("FEED_CONSISTENCY_WAIT"),
		LeaseTTL:         duration("FEED_LEASE_TTL"),
		ResumeWindow:     duration("FEED_RESUME_WINDOW"),
		NodeID:           integer("FEED_NODE_ID", 0, 255),
		NATSURL:          get("NATS_URL"),
		RedisURL:         get("REDIS_URL"),
		DatabaseURL:      get("DATABASE_URL"),
		NATSPort:         integer("FEED_NATS_PORT", 0, 65535),
		NATSSync:         get("FEED_NATS_SYNC"),
		StreamName:       get("FEED_STREAM"),
		Replicas:         optional(integer, "FEED_STREAM_REPLICAS", 1, 5),
		RedisReplicaAcks: -1,
		DedupWindow:      duration("FEED_DEDUP_WINDOW"),
		DevRedisPort:     integer("FEED_DEV_REDIS_PORT", 0, 65535),
		DevRedisRealtime: integer("FEED_DEV_REDIS_REALTIME", 0, 99),
		DevPGPort:        integer("FEED_DEV_POSTGRES_PORT", 0, 65535),
		InboxCap:         integer("FEED_INBOX_CAP", 10, 100_000),
		OutboxCap:        integer("FEED_OUTBOX_CAP", 10, 100_000),
		InboxTTL:         duration("FEED_INBOX_TTL"),
		BigAccount:       integer("FEED_BIG_ACCOUNT", 1, 1<<31-1),
		Partitions:       integer("FEED_PARTITIONS", 1, 256),
		PostCache:        integer("FEED_POST_CACHE", 0, 10_000_000),
		PageCache:        integer("FEED_PAGE_CACHE", 0, 10_000_000),
		MaintenanceRate:  integer("FEED_MAINTENANCE_RATE", 1, 100_000),
		ActivityKeep:     integer("FEED_ACTIVITY_KEEP", 10, 1_000_000),

		MediaGrace:           duration("FEED_MEDIA_GRACE"),
		MediaCollectInterval: duration("FEED_MEDIA_COLLECT_INTERVAL"),
		MediaStore:           get("FEED_MEDIA_STORE"),
		Web:                  get("FEED_WEB"),
	}
	if cfg.Web != "" && cfg.Web != "0" && cfg.Web != "1" {
		errs = append(errs, fmt.Sprintf("FEED_WEB=%q is not 1 or 0", cfg.Web))
	}
	if get("FEED_REDIS_REPLICA_ACKS") != "" {
		cfg.RedisReplicaAcks = integer("FEED_REDIS_REPLICA_ACKS", 0, 5)
	}
	if cfg.MediaStore != MediaPack && cfg.MediaStore != MediaObjectStore {
		errs = append(errs, fmt.Sprintf("FEED_MEDIA_STORE=%q is not %s or %s", cfg.MediaStore, MediaPack, MediaObjectStore))
	}
	if cfg.LeaseTTL < time.Second {
		errs = append(errs, fmt.Sprintf("FEED_LEASE_TTL=%q is shorter than 1s: renewals every fifth of it would be too frequent to survive a pause", get("FEED_LEASE_TTL")))
	}
	if cfg.MediaGrace < minMediaGrace {
		errs = append(errs, fmt.Sprintf("FEED_MEDIA_GRACE=%q is shorter than %s, the longest an upload may wait for its post", get("FEED_MEDIA_GRACE"), minMediaGrace))
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(get("FEED_LOG_LEVEL"))); err != nil {
		errs = append(errs, fmt.Sprintf("FEED_LOG_LEVEL=%q is not debug, info, warn or error", get("FEED_LOG_LEVEL")))
	}
	if cfg.LogFormat != "text" && cfg.LogFormat != "json" {
		errs = append(errs, fmt.Sprintf("FEED_LOG_FORMAT=%q is not text or json", cfg.LogFormat))
	}
	if cfg.NATSSync != "always" {
		if d, err := time.ParseDuration(cfg.NATSSync); err != nil || d <= 0 {
			errs = append(errs, fmt.Sprintf("FEED_NATS_SYNC=%q is not always or a positive duration", cfg.NATSSync))
		}
	}
	for _, r := range strings.Split(get("FEED_ROLES"), ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		if !slices.Contains(knownRoles, r) {
			errs = append(errs, fmt.Sprintf("FEED_ROLES: unknown role %q (known: %s)", r, strings.Join(knownRoles, ", ")))
			continue
		}
		if !slices.Contains(cfg.Roles, r) {
			cfg.Roles = append(cfg.Roles, r)
		}
	}
	if len(cfg.Roles) == 0 {
		errs = append(errs, "FEED_ROLES names no role")
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return cfg, nil
}

// NATSEndpoint is the NATS server to connect to: NATS_URL, or the one
// `feed dev` starts (feed nats) on its loopback port.
func (c Config) NATSEndpoint() string {
	if c.NATSURL != "" {
		return c.NATSURL
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", c.NATSPort)
}

// RedisEndpoint is the Redis to connect to: REDIS_URL, or `feed dev`'s child.
func (c Config) RedisEndpoint() string {
	if c.RedisURL != "" {
		return c.RedisURL
	}
	return fmt.Sprintf("redis://127.0.0.1:%d/0", c.DevRedisPort)
}

// DatabaseEndpoint is the Postgres to connect to: DATABASE_URL, or `feed
// dev`'s child.
func (c Config) DatabaseEndpoint() string {
	if c.DatabaseURL != "" {
		return c.DatabaseURL
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/feed?sslmode=disable", c.DevPGPort)
}
