package loadbench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"

	"github.com/feedproject/feed/domain"
)

// requestTimeout bounds every request of the bench.
const requestTimeout = 10 * time.Second

// client speaks the service's HTTP contract as many users. It is a fasthttp
// client (the server's own library): the generator shares the machine with
// the service, and with net/http's client, a goroutine pair and a header map
// a request, and pages decoded by reflection, it took a third of a core at the
// soak's 2 000 requests a second (perf over a soak's mixed phase: transport
// 36 % of the bench's process, decoding 19 %, growing goroutines' stacks 7 %).
type client struct {
	base   string // scheme and host, for the requests' URIs and messages
	hc     *fasthttp.HostClient
	bearer []string // the Authorization header of each user, by user-1
}

func newClient(base string, tokens []string, conns int) (*client, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("service URL %q: want http://host:port", base)
	}
	bearer := make([]string, len(tokens))
	for i, t := range tokens {
		bearer[i] = "Bearer " + t
	}
	return &client{
		base: u.Scheme + "://" + u.Host,
		hc: &fasthttp.HostClient{
			Addr:  fasthttp.AddMissingPort(u.Host, u.Scheme == "https"),
			IsTLS: u.Scheme == "https",
			// The open loop's requests, the freshness pollers and the sampler:
			// a request that finds them all busy waits for one rather than fail.
			MaxConns:                      conns + 512,
			MaxConnWaitTimeout:            requestTimeout,
			MaxIdleConnDuration:           time.Minute,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
		},
		bearer: bearer,
	}, nil
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// statusError is an answer other than the one expected.
type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("status %d: %s", e.status, e.body)
}

// request is one request of the bench; the zero value is a GET of nothing.
type request struct {
	user        domain.UserID // 0: anonymous
	method      string
	path        string
	body        []byte
	contentType string
	accept      string
	minPosition uint64 // X-Min-Position, if not 0
}

// do sends req and, if the answer has the wanted status, hands its body to
// read (if not nil; the body is valid only during the call). It returns the
// answer's X-Position (0 if absent). A request is bounded by requestTimeout
// and ctx's deadline; one sent before ctx is cancelled is answered (or times
// out) rather than abandoned.
func (c *client) do(ctx context.Context, r request, want int, read func(body []byte) error) (uint64, error) {
	method := cmp.Or(r.method, fasthttp.MethodGet)
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, r.path, err)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(c.base + r.path)
	if r.user > 0 {
		req.Header.Set(fasthttp.HeaderAuthorization, c.bearer[r.user-1])
	}
	if r.contentType != "" {
		req.Header.SetContentType(r.contentType)
	}
	if r.accept != "" {
		req.Header.Set(fasthttp.HeaderAccept, r.accept)
	}
	if r.minPosition > 0 {
		req.Header.Set("X-Min-Position", strconv.FormatUint(r.minPosition, 10))
	}
	if r.body != nil {
		req.SetBodyRaw(r.body)
	}
	deadline := time.Now().Add(requestTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.hc.DoDeadline(req, resp, deadline); err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, r.path, err)
	}
	pos, _ := strconv.ParseUint(string(resp.Header.Peek("X-Position")), 10, 64)
	if resp.StatusCode() != want {
		b := resp.Body()
		b = b[:min(len(b), 512)]
		return pos, fmt.Errorf("%s %s: %w", method, r.path, &statusError{status: resp.StatusCode(), body: strings.TrimSpace(string(b))})
	}
	if read != nil {
		if err := read(resp.Body()); err != nil {
			return pos, fmt.Errorf("%s %s: read answer: %w", method, r.path, err)
		}
	}
	return pos, nil
}

// accepted is a command's 202 answer.
type accepted struct {
	ID       string `json:"id"`
	Position string `json:"position"`
}

func (a accepted) position() uint64 {
	p, _ := strconv.ParseUint(a.Position, 10, 64)
	return p
}

func (c *client) command(ctx context.Context, user domain.UserID, method, path string, body []byte, contentType string) (accepted, error) {
	var a accepted
	_, err := c.do(ctx, request{user: user, method: method, path: path, body: body, contentType: contentType},
		fasthttp.StatusAccepted, func(b []byte) error { return jsonv2.Unmarshal(b, &a) })
	return a, err
}

// post creates a post from a prepared multipart body.
func (c *client) post(ctx context.Context, user domain.UserID, form multipartForm) (domain.PostID, uint64, error) {
	a, err := c.command(ctx, user, fasthttp.MethodPost, "/posts", form.body, form.contentType)
	if err != nil {
		return 0, 0, err
	}
	id, err := strconv.ParseInt(a.ID, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("POST /posts: post id %q: %w", a.ID, err)
	}
	return domain.PostID(id), a.position(), nil
}

func (c *client) follow(ctx context.Context, user, followee domain.UserID, follow bool) (uint64, error) {
	method := fasthttp.MethodPost
	if !follow {
		method = fasthttp.MethodDelete
	}
	a, err := c.command(ctx, user, method, fmt.Sprintf("/users/%d/follow", followee), nil, "")
	return a.position(), err
}

func (c *client) like(ctx context.Context, user domain.UserID, post domain.PostID) (uint64, error) {
	a, err := c.command(ctx, user, fasthttp.MethodPost, fmt.Sprintf("/posts/%d/like", post), nil, "")
	return a.position(), err
}

func (c *client) comment(ctx context.Context, user domain.UserID, post domain.PostID, text string) (uint64, error) {
	body, _ := json.Marshal(map[string]string{"text": text})
	a, err := c.command(ctx, user, fasthttp.MethodPost, fmt.Sprintf("/posts/%d/comments", post), body, "application/json")
	return a.position(), err
}

// feedPage is the part of a GET /feed answer the bench looks at.
type feedPage struct {
	IDs        []domain.PostID // newest first
	NextCursor string          // "" when null
	HasMore    bool
}

// decodeFeedPage reads the post ids, next_cursor and has_more of a GET /feed
// answer token by token, skipping everything else: the freshness poller reads
// hundreds of pages a second, and unmarshalling each whole page into structs
// was a fifth of the generator's CPU.
func decodeFeedPage(b []byte) (feedPage, error) {
	var page feedPage
	dec := jsontext.NewDecoder(bytes.NewReader(b))
	if err := expectKind(dec, '{'); err != nil {
		return page, err
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return page, err
		}
		switch name.String() {
		case "posts":
			if page.IDs, err = decodePostIDs(dec); err != nil {
				return page, err
			}
		case "next_cursor":
			tok, err := dec.ReadToken()
			if err != nil {
				return page, err
			}
			if tok.Kind() == '"' {
				page.NextCursor = tok.String()
			}
		case "has_more":
			tok, err := dec.ReadToken()
			if err != nil {
				return page, err
			}
			page.HasMore = tok.Kind() == 't'
		default:
			if err := dec.SkipValue(); err != nil {
				return page, err
			}
		}
	}
	return page, expectKind(dec, '}')
}

// decodePostIDs reads an array of posts and returns their ids.
func decodePostIDs(dec *jsontext.Decoder) ([]domain.PostID, error) {
	if err := expectKind(dec, '['); err != nil {
		return nil, err
	}
	ids := make([]domain.PostID, 0, domain.PageSize)
	for dec.PeekKind() != ']' {
		if err := expectKind(dec, '{'); err != nil {
			return nil, err
		}
		for dec.PeekKind() != '}' {
			name, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			if name.String() != "id" {
				if err := dec.SkipValue(); err != nil {
					return nil, err
				}
				continue
			}
			tok, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			id, err := strconv.ParseInt(tok.String(), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("post id %s: %w", tok, err)
			}
			ids = append(ids, domain.PostID(id))
		}
		if err := expectKind(dec, '}'); err != nil {
			return nil, err
		}
	}
	return ids, expectKind(dec, ']')
}

// expectKind reads the next token and fails unless it is of kind k.
func expectKind(dec *jsontext.Decoder, k jsontext.Kind) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	if tok.Kind() != k {
		return fmt.Errorf("at %s: %v where %v was expected", dec.StackPointer(), tok.Kind(), k)
	}
	return nil
}

// firstPage reads the first page of user's home feed without decoding it.
func (c *client) firstPage(ctx context.Context, user domain.UserID) error {
	_, err := c.do(ctx, request{user: user, path: "/feed"}, fasthttp.StatusOK, nil)
	return err
}

// feed reads a page of user's home feed (cursor "" for the first), waiting
// for minPosition when it is not 0; it returns the page and its X-Position.
func (c *client) feed(ctx context.Context, user domain.UserID, cursor string, minPosition uint64) (feedPage, uint64, error) {
	path := "/feed"
	if cursor != "" {
		path += "?cursor=" + cursor
	}
	var page feedPage
	pos, err := c.do(ctx, request{user: user, path: path, minPosition: minPosition}, fasthttp.StatusOK,
		func(b []byte) (err error) { page, err = decodeFeedPage(b); return err })
	return page, pos, err
}

// readModelPosition is the read model's position, waiting for minPosition.
func (c *client) readModelPosition(ctx context.Context, user domain.UserID, minPosition uint64) (uint64, error) {
	return c.do(ctx, request{path: fmt.Sprintf("/users/%d/followers", user), minPosition: minPosition}, fasthttp.StatusOK, nil)
}

// ready is nil once GET /readyz answers 200.
func (c *client) ready(ctx context.Context) error {
	_, err := c.do(ctx, request{path: "/readyz"}, fasthttp.StatusOK, nil)
	return err
}

// metrics scrapes GET /metrics.
func (c *client) metrics(ctx context.Context) (metricSet, error) {
	var fams map[string]*dto.MetricFamily
	_, err := c.do(ctx, request{path: "/metrics", accept: "text/plain"}, fasthttp.StatusOK, func(b []byte) (err error) {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = p.TextToMetricFamilies(bytes.NewReader(b))
		return err
	})
	if err != nil {
		return nil, err
	}
	return metricSet(fams), nil
}

// metricSet is one scrape of the service's metrics.
type metricSet map[string]*dto.MetricFamily

// sum adds the values of the family's series whose labels include every
// label given (name, value pairs); histograms count their observations.
func (m metricSet) sum(family string, labels ...string) float64 {
	f, ok := m[family]
	if !ok {
		return 0
	}
	total := 0.0
	for _, s := range f.GetMetric() {
		if !hasLabels(s, labels) {
			continue
		}
		switch {
		case s.Counter != nil:
			total += s.GetCounter().GetValue()
		case s.Gauge != nil:
			total += s.GetGauge().GetValue()
		case s.Histogram != nil:
			total += float64(s.GetHistogram().GetSampleCount())
		case s.Untyped != nil:
			total += s.GetUntyped().GetValue()
		}
	}
	return total
}

func hasLabels(s *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// histSum adds up the sums of the family's histogram series whose labels
// include the ones given.
func (m metricSet) histSum(family string, labels ...string) float64 {
	f, ok := m[family]
	if !ok {
		return 0
	}
	total := 0.0
	for _, s := range f.GetMetric() {
		if s.Histogram != nil && hasLabels(s, labels) {
			total += s.GetHistogram().GetSampleSum()
		}
	}
	return total
}

// bucket is one cumulative bucket of a Prometheus histogram.
type bucket struct {
	upper float64 // seconds; +Inf for the last
	count float64 // observations at or below upper
}

// buckets adds up the cumulative buckets of the family's histogram series
// whose labels include the ones given; the last bucket is +Inf.
func (m metricSet) buckets(family string, labels ...string) []bucket {
	f, ok := m[family]
	if !ok {
		return nil
	}
	byUpper := map[float64]float64{}
	for _, s := range f.GetMetric() {
		if s.Histogram == nil || !hasLabels(s, labels) {
			continue
		}
		for _, b := range s.GetHistogram().GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // the text format lists it, the protobuf one not
				byUpper[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		byUpper[math.Inf(1)] += float64(s.GetHistogram().GetSampleCount())
	}
	out := make([]bucket, 0, len(byUpper))
	for _, ub := range slices.Sorted(maps.Keys(byUpper)) {
		out = append(out, bucket{upper: ub, count: byUpper[ub]})
	}
	return out
}
