package loadbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/feedproject/feed/domain"
)

// requestTimeout bounds every request of the bench.
const requestTimeout = 10 * time.Second

// client speaks the service's HTTP contract as many users.
type client struct {
	base   string
	http   *http.Client
	tokens []string // by user-1
}

func newClient(base string, tokens []string, conns int) *client {
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &client{base: strings.TrimRight(base, "/"), http: &http.Client{Transport: tr, Timeout: requestTimeout}, tokens: tokens}
}

func (c *client) close() { c.http.CloseIdleConnections() }

// statusError is an answer other than the one expected.
type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("status %d: %s", e.status, e.body)
}

// do sends a request as user (0: anonymous) and decodes a JSON answer with the
// wanted status into out (if not nil). It returns the answer's headers.
func (c *client) do(ctx context.Context, user domain.UserID, method, path string, body io.Reader, contentType string, hdr map[string]string, want int, out any) (http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if user > 0 {
		req.Header.Set("Authorization", "Bearer "+c.tokens[user-1])
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.Header, fmt.Errorf("%s %s: %w", method, path, &statusError{status: resp.StatusCode, body: strings.TrimSpace(string(b))})
	}
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	} else {
		// The v2 decoder (the service's own for events): at 5 000 pages a
		// second, encoding/json's took half the generator's CPU.
		err = jsonv2.UnmarshalRead(resp.Body, out)
	}
	if err != nil {
		return resp.Header, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	return resp.Header, nil
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
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	_, err := c.do(ctx, user, method, path, r, contentType, nil, http.StatusAccepted, &a)
	return a, err
}

// post creates a post from a prepared multipart body.
func (c *client) post(ctx context.Context, user domain.UserID, form multipartForm) (domain.PostID, uint64, error) {
	a, err := c.command(ctx, user, http.MethodPost, "/posts", form.body, form.contentType)
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
	method := http.MethodPost
	if !follow {
		method = http.MethodDelete
	}
	a, err := c.command(ctx, user, method, fmt.Sprintf("/users/%d/follow", followee), nil, "")
	return a.position(), err
}

func (c *client) like(ctx context.Context, user domain.UserID, post domain.PostID) (uint64, error) {
	a, err := c.command(ctx, user, http.MethodPost, fmt.Sprintf("/posts/%d/like", post), nil, "")
	return a.position(), err
}

func (c *client) comment(ctx context.Context, user domain.UserID, post domain.PostID, text string) (uint64, error) {
	body, _ := json.Marshal(map[string]string{"text": text})
	a, err := c.command(ctx, user, http.MethodPost, fmt.Sprintf("/posts/%d/comments", post), body, "application/json")
	return a.position(), err
}

// feedPage is the part of a GET /feed answer the bench looks at.
type feedPage struct {
	Posts []struct {
		ID string `json:"id"`
	} `json:"posts"`
	NextCursor *string `json:"next_cursor"`
	HasMore    bool    `json:"has_more"`
}

// ids are the page's post ids, newest first.
func (p feedPage) ids() []domain.PostID {
	out := make([]domain.PostID, 0, len(p.Posts))
	for _, post := range p.Posts {
		if id, err := strconv.ParseInt(post.ID, 10, 64); err == nil {
			out = append(out, domain.PostID(id))
		}
	}
	return out
}

// firstPage reads the first page of user's home feed without decoding it.
func (c *client) firstPage(ctx context.Context, user domain.UserID) error {
	_, err := c.do(ctx, user, http.MethodGet, "/feed", nil, "", nil, http.StatusOK, nil)
	return err
}

// feed reads a page of user's home feed (cursor "" for the first), waiting
// for minPosition when it is not 0; it returns the page and its X-Position.
func (c *client) feed(ctx context.Context, user domain.UserID, cursor string, minPosition uint64) (feedPage, uint64, error) {
	path := "/feed"
	if cursor != "" {
		path += "?cursor=" + cursor
	}
	var hdr map[string]string
	if minPosition > 0 {
		hdr = map[string]string{"X-Min-Position": strconv.FormatUint(minPosition, 10)}
	}
	var page feedPage
	h, err := c.do(ctx, user, http.MethodGet, path, nil, "", hdr, http.StatusOK, &page)
	if err != nil {
		return page, 0, err
	}
	pos, _ := strconv.ParseUint(h.Get("X-Position"), 10, 64)
	return page, pos, nil
}

// readModelPosition is the read model's position, waiting for minPosition.
func (c *client) readModelPosition(ctx context.Context, user domain.UserID, minPosition uint64) (uint64, error) {
	hdr := map[string]string{"X-Min-Position": strconv.FormatUint(minPosition, 10)}
	h, err := c.do(ctx, 0, http.MethodGet, fmt.Sprintf("/users/%d/followers", user), nil, "", hdr, http.StatusOK, nil)
	if err != nil {
		return 0, err
	}
	pos, _ := strconv.ParseUint(h.Get("X-Position"), 10, 64)
	return pos, nil
}

// ready is nil once GET /readyz answers 200.
func (c *client) ready(ctx context.Context) error {
	_, err := c.do(ctx, 0, http.MethodGet, "/readyz", nil, "", nil, http.StatusOK, nil)
	return err
}

// metrics scrapes GET /metrics.
func (c *client) metrics(ctx context.Context) (metricSet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %w", &statusError{status: resp.StatusCode})
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: parse: %w", err)
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
