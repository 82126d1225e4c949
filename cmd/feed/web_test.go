package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
	feedhttp "github.com/feedproject/feed/http"
)

var webScreenshot = flag.String("web.screenshot", "", "write a screenshot of the web page's home feed to this PNG file (docs/web-feed.png)")

func TestWebPageIsDevelopmentsUnlessAsked(t *testing.T) {
	tests := []struct {
		web, secret string
		dev         bool
		wantPage    bool
		wantSignIn  feedhttp.DevSignIn
	}{
		{"", "", true, true, feedhttp.DevSignInOpen},
		{"", "a-secret-of-sixteen-bytes", true, true, feedhttp.DevSignInRefused},
		{"0", "", true, false, feedhttp.DevSignInOpen},
		{"", "a-secret-of-sixteen-bytes", false, false, feedhttp.DevSignInAbsent},
		{"1", "a-secret-of-sixteen-bytes", false, true, feedhttp.DevSignInAbsent},
	}
	for _, tt := range tests {
		cfg, err := stack.Parse(func(k string) string {
			return map[string]string{"FEED_WEB": tt.web, "FEED_JWT_SECRET": tt.secret}[k]
		})
		require.NoError(t, err)
		assert.Equal(t, tt.wantPage, cfg.ServesWebPage(tt.dev), "FEED_WEB=%q dev=%v", tt.web, tt.dev)
		assert.Equal(t, tt.wantSignIn, devSignIn(cfg, tt.dev), "FEED_JWT_SECRET=%q dev=%v", tt.secret, tt.dev)
	}
	_, err := stack.Parse(func(k string) string { return map[string]string{"FEED_WEB": "yes"}[k] })
	assert.ErrorContains(t, err, `FEED_WEB="yes"`)
}

// The end-to-end test of the web page: two people, A and B, each in a
// browser context of their own in headless Chromium, against `feed dev`.
func TestWebPageInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "Chromium drives this test: install it with `go tool task setup` (Debian: apt-get install chromium)")

	// Inboxes and outboxes of 10, so that B's older posts are in Postgres only.
	const olderPosts = 24
	dir := devDataDir(t)
	p := freePorts(t, 3)
	env := devEnv(dir, devPorts{nats: p[0], redis: p[1], postgres: p[2]})
	base, _ := startRun(t, "dev", func(k string) string {
		switch k {
		case "FEED_INBOX_CAP", "FEED_OUTBOX_CAP":
			return "10"
		}
		return env(k)
	})
	waitReady(t, base)

	const userA, userB = "1001", "2002"
	tokenB := devToken(t, base, userB)

	// B's older posts, made through the API before A follows B.
	var older []string
	for i := range olderPosts {
		older = append(older, createCaptioned(t, base, tokenB, fmt.Sprintf("Older post %d", i+1), testImage(t, i, 240, 180)))
	}
	slices.Reverse(older) // newest first, as the feed has them

	br := newBrowser(t, chromium)
	a := br.user(t, "A", base)
	b := br.user(t, "B", base)
	step := br.stepper(t)

	step("A signs in with the keyboard", func() error {
		if err := a.do(
			chromedp.Navigate(base+"/"),
			chromedp.WaitVisible(chromedp.ID("dev-user")),
		); err != nil {
			return err
		}
		if err := a.accessible(); err != nil {
			return err
		}
		return a.do(
			chromedp.SendKeys(chromedp.ID("dev-user"), userA+"\n"),
			chromedp.WaitVisible(chromedp.ID("feed-empty")),
		)
	})

	step("A opens B's profile, follows B, and is among B's followers", func() error {
		if err := a.do(
			chromedp.SendKeys(chromedp.ID("find-user"), userB+"\n"),
			chromedp.WaitVisible(chromedp.CSS(`#follow[aria-pressed="false"]:enabled`)),
			chromedp.Click(chromedp.ID("follow")),
			chromedp.WaitVisible(chromedp.CSS(`#follow[aria-pressed="true"]`)),
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`a[href="#/users/%s/followers"]`, userB))),
		); err != nil {
			return err
		}
		if _, err := a.waitFor(fmt.Sprintf(`[...document.querySelectorAll('#followers li')].map(l => l.textContent).join() === 'User %s'`, userA)); err != nil {
			return err
		}
		return a.accessible()
	})

	step("A's home feed has B's posts at once (read-your-writes)", func() error {
		if err := a.do(chromedp.Click(chromedp.CSS(`#nav [data-nav="home"]`))); err != nil {
			return err
		}
		ids, err := a.waitFor(`document.querySelectorAll('#feed article').length >= 10 &&
			[...document.querySelectorAll('#feed article')].slice(0, 10).map(e => e.dataset.postId)`)
		if err != nil {
			return err
		}
		return equalIDs(older[:10], ids)
	})

	var newPost string
	step("B signs in and sees the API's errors: not an image, too large, too many", func() error {
		if err := b.do(
			chromedp.Navigate(base+"/"),
			chromedp.WaitVisible(chromedp.ID("dev-user")),
			chromedp.SendKeys(chromedp.ID("dev-user"), userB+"\n"),
			chromedp.WaitVisible(chromedp.ID("feed-empty")),
			chromedp.Click(chromedp.CSS(`#nav [data-nav="compose"]`)),
			chromedp.WaitVisible(chromedp.ID("images")),
		); err != nil {
			return err
		}
		if err := b.accessible(); err != nil {
			return err
		}
		text := []byte("plain text, not an image\n")
		large := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 5<<20)...)
		var eleven [][]byte
		var elevenNames []string
		for i := range 11 {
			eleven = append(eleven, testImage(t, i, 8, 8))
			elevenNames = append(elevenNames, fmt.Sprintf("eleven-%d.png", i))
		}
		for _, c := range []struct {
			status int
			names  []string
			files  [][]byte
		}{
			{http.StatusUnsupportedMediaType, []string{"notes.txt"}, [][]byte{text}},
			{http.StatusRequestEntityTooLarge, []string{"large.png"}, [][]byte{large}},
			{http.StatusBadRequest, elevenNames, eleven},
		} {
			var paths []string
			for i, name := range c.names {
				paths = append(paths, writeFile(t, name, c.files[i]))
			}
			if err := b.do(
				chromedp.Reload(), // a new form
				chromedp.WaitVisible(chromedp.ID("images")),
				chromedp.SetUploadFiles(chromedp.ID("images"), paths),
				chromedp.Click(chromedp.ID("publish")),
			); err != nil {
				return err
			}
			if err := b.expectError("compose-error", apiError(t, base, tokenB, c.status, c.names, c.files)); err != nil {
				return fmt.Errorf("%d: %w", c.status, err)
			}
		}
		return nil
	})

	step("B publishes a post of two images, previewed first", func() error {
		first := writeFile(t, "sunrise.png", testImage(t, 100, 480, 360))
		second := writeFile(t, "dusk.png", testImage(t, 200, 480, 360))
		err := b.do(
			chromedp.Reload(), // a new form
			chromedp.WaitVisible(chromedp.ID("images")),
			chromedp.SetUploadFiles(chromedp.ID("images"), []string{first, second}),
		)
		if err != nil {
			return err
		}
		if _, err := b.waitFor(`[...document.querySelectorAll('#previews img')].filter(i => i.complete && i.naturalWidth === 480).length === 2`); err != nil {
			return fmt.Errorf("previews: %w", err)
		}
		if err := b.do(
			chromedp.SendKeys(chromedp.ID("caption"), "Two images from B"),
			chromedp.Click(chromedp.ID("publish")),
		); err != nil {
			return err
		}
		id, err := b.waitFor(`document.querySelectorAll('.post-page .media img').length === 2 &&
			[...document.querySelectorAll('.post-page .media img')].every(i => i.complete && i.naturalWidth === 480) &&
			document.querySelector('.post-page').dataset.postId`)
		newPost = id
		return err
	})

	step("B edits the caption", func() error {
		if err := b.do(
			chromedp.Click(chromedp.ID("edit")),
			chromedp.WaitVisible(chromedp.ID("edit-caption")),
			chromedp.SendKeys(chromedp.ID("edit-caption"), ", at dawn and at dusk"),
			chromedp.Click(chromedp.CSS(`#edit-form button[type="submit"]`)),
		); err != nil {
			return err
		}
		_, err := b.waitFor(`document.getElementById('post-caption')?.textContent === 'Two images from B, at dawn and at dusk' &&
			document.getElementById('edited').textContent === '(edited)'`)
		return err
	})

	step("A is told of B's new post without reloading, and opens it", func() error {
		if _, err := a.waitFor(`(b => !b.hidden && b.textContent.includes('1 new post'))(document.getElementById('new-posts'))`); err != nil {
			return err
		}
		return a.do(chromedp.Click(chromedp.ID("new-posts")))
	})
	step("A's feed starts with B's new post, its two images loaded", func() error {
		// The second image is lazy, beside the first: it loads when swiped to.
		_, err := a.waitFor(fmt.Sprintf(`(a => a && a.dataset.postId === %q &&
			(imgs => imgs.length === 2 && imgs[0].complete && imgs[0].naturalWidth === 480 &&
				imgs.every(i => new URL(i.src).pathname.startsWith('/media/')))([...a.querySelectorAll('.media img')]))(document.querySelector('#feed article'))`, newPost))
		return err
	})
	if *webScreenshot != "" {
		ctx, cancel := context.WithTimeout(a.ctx, stepTimeout)
		shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		cancel()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(*webScreenshot, shot, 0o644))
	}

	fromPostgres := func() float64 { return homePages(t, base, "postgres") + homePages(t, base, "mixed") }
	pagesBefore := fromPostgres()
	if err := a.accessible(); err != nil {
		t.Error(err)
	}
	step("A scrolls B's older posts past the cache into Postgres, to the end", func() error {
		ids, err := a.waitFor(`(() => {
			window.scrollTo(0, document.body.scrollHeight);
			const end = document.getElementById('feed-end');
			return end && !end.hidden && [...document.querySelectorAll('#feed article')].map(e => e.dataset.postId);
		})()`)
		if err != nil {
			return err
		}
		return equalIDs(append([]string{newPost}, older...), ids)
	})
	assert.Greater(t, fromPostgres(), pagesBefore, "pages of A's feed came from Postgres")

	step("B watches the activity tab, where A's follow is", func() error {
		if err := b.do(chromedp.Click(chromedp.CSS(`#nav [data-nav="activity"]`))); err != nil {
			return err
		}
		if _, err := b.waitFor(fmt.Sprintf(`(items => items.length === 1 && items[0].dataset.type === 'follow' &&
			items[0].textContent.includes('User %s followed you'))([...document.querySelectorAll('#activity li')])`, userA)); err != nil {
			return err
		}
		return b.accessible()
	})

	step("A likes B's new post and comments on it", func() error {
		err := a.do(
			chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`),
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`#feed article[data-post-id="%s"] .open-post`, newPost))),
			chromedp.WaitVisible(chromedp.CSS(`#like[aria-pressed="false"]`)),
			chromedp.Click(chromedp.ID("like")),
			chromedp.WaitVisible(chromedp.CSS(`#like[aria-pressed="true"]`)),
		)
		if err != nil {
			return err
		}
		if _, err := a.waitFor(`document.getElementById('like-count').textContent === '1 like'`); err != nil {
			return err
		}
		if err := a.do(chromedp.SendKeys(chromedp.ID("comment-text"), "Lovely light"), chromedp.Click(chromedp.CSS(`#comment-form button[type="submit"]`))); err != nil {
			return err
		}
		if _, err = a.waitFor(`[...document.querySelectorAll('#comments .comment-text')].some(c => c.textContent === 'Lovely light')`); err != nil {
			return err
		}
		return a.accessible()
	})

	step("B sees A's like and comment in activity without reloading", func() error {
		_, err := b.waitFor(fmt.Sprintf(`(items => items.length === 3 &&
			items.some(i => i.dataset.type === 'like' && i.textContent.includes('User %[1]s liked your post')) &&
			items.some(i => i.dataset.type === 'comment' && i.textContent.includes('User %[1]s commented on your post: Lovely light')))([...document.querySelectorAll('#activity li')])`, userA))
		return err
	})

	step("A goes back to the home feed", func() error {
		return a.do(chromedp.Click(chromedp.CSS(`#nav [data-nav="home"]`)),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#feed article[data-post-id="%s"]`, newPost))))
	})

	step("B deletes the post", func() error {
		return b.do(
			chromedp.Navigate(base+"/#/posts/"+newPost),
			chromedp.Click(chromedp.ID("delete")),
			chromedp.Click(chromedp.ID("confirm-delete")),
			chromedp.WaitVisible(chromedp.ID("grid")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector('#grid li') && !document.querySelector('#grid [data-post-id="%s"]')`, newPost),
				chromedp.WithPollingInterval(100*time.Millisecond)),
		)
	})

	step("the deleted post leaves A's page without reloading", func() error {
		_, err := a.waitFor(fmt.Sprintf(`!!document.querySelector('#feed article') && !document.querySelector('[data-post-id="%s"]')`, newPost))
		return err
	})

	step("A unfollows B from B's profile, and B's posts leave A's feed", func() error {
		return a.do(
			chromedp.Click(chromedp.CSS(`#feed article header a`)),
			chromedp.WaitVisible(chromedp.CSS(`#follow[aria-pressed="true"]:enabled`)),
			chromedp.Click(chromedp.ID("follow")),
			chromedp.WaitVisible(chromedp.CSS(`#follow[aria-pressed="false"]`)),
			chromedp.Click(chromedp.CSS(`#nav [data-nav="home"]`)),
			chromedp.WaitVisible(chromedp.ID("feed-empty")),
		)
	})

	step("A signs out, and in again with a token", func() error {
		return a.do(
			chromedp.Click(chromedp.ID("sign-out")),
			chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SendKeys(chromedp.ID("token"), devToken(t, base, userA)),
			chromedp.Click(chromedp.CSS(`#token-sign-in button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.ID("feed-empty")),
		)
	})

	br.checkRequests(t, base)
}

// browser is headless Chromium with a browser context for each user, which
// records every request the page makes and every uncaught exception.
type browser struct {
	ctx      context.Context
	mu       sync.Mutex
	urls     []string
	outcomes []string // each request's answer or failure, for a failed step's report
	blocked  []string
	fails    []string
	users    []*browserUser
}

type browserUser struct {
	name string
	ctx  context.Context
}

// stepTimeout bounds each step.
const stepTimeout = 30 * time.Second

func newBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // root in a container has no user namespace to sandbox with
		chromedp.DisableGPU,
		chromedp.WindowSize(412, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return &browser{ctx: ctx}
}

// user opens a tab in a browser context of its own: its own storage, so its
// own sign-in.
func (br *browser) user(t *testing.T, name, base string) *browserUser {
	t.Helper()
	sent := map[network.RequestID]string{}
	ctx, cancel := chromedp.NewContext(br.ctx, chromedp.WithNewBrowserContext(), chromedp.WithListener(func(ev any) {
		br.mu.Lock()
		defer br.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			br.urls = append(br.urls, ev.Request.URL)
			u, _, _ := strings.Cut(ev.Request.URL, "?") // no token in the test's log
			sent[ev.RequestID] = ev.Request.Method + " " + u
		case *network.EventResponseReceived:
			br.outcomes = append(br.outcomes, fmt.Sprintf("%s: %s: %d", name, sent[ev.RequestID], ev.Response.Status))
		case *network.EventLoadingFailed:
			br.outcomes = append(br.outcomes, fmt.Sprintf("%s: %s: %s", name, sent[ev.RequestID], ev.ErrorText))
		case *cdplog.EventEntryAdded:
			// The content security policy stops a request outside the
			// service before it is sent, and says so here.
			if ev.Entry.Source == cdplog.EntrySourceSecurity {
				br.blocked = append(br.blocked, fmt.Sprintf("%s: %s", name, ev.Entry.Text))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			what := d.Text
			if d.Exception != nil {
				what += " " + d.Exception.Description
			}
			br.fails = append(br.fails, fmt.Sprintf("%s: %s:%d: %s", name, d.URL, d.LineNumber+1, what))
		}
	}))
	t.Cleanup(cancel)
	// A phone's width, at a phone's pixel density.
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(412, 900, chromedp.EmulateScale(2))))
	u := &browserUser{name: name, ctx: ctx}
	br.users = append(br.users, u)
	return u
}

func (u *browserUser) do(actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(u.ctx, stepTimeout)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// waitFor polls a JavaScript expression until it is truthy and returns its
// value: a string, or a list of them joined by commas.
func (u *browserUser) waitFor(expr string) (string, error) {
	ctx, cancel := context.WithTimeout(u.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Poll[any](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(0)))
	if err != nil {
		return "", fmt.Errorf("%s: waiting for %s: %w", u.name, strings.Join(strings.Fields(expr), " "), err)
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case []any:
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprint(x)
		}
		return strings.Join(s, ","), nil
	}
	return fmt.Sprint(v), nil
}

// accessible checks the page shown: every form control has a label, every
// image an alt text (empty for decoration), every button and link a name,
// and there is one h1.
func (u *browserUser) accessible() error {
	ctx, cancel := context.WithTimeout(u.ctx, stepTimeout)
	defer cancel()
	problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const out = [];
		const show = (el) => el.outerHTML.slice(0, 100);
		const hidden = (el) => el.closest('[hidden], [aria-hidden="true"]');
		for (const el of document.querySelectorAll('input, textarea, select')) {
			if (!hidden(el) && el.labels.length === 0 && !el.getAttribute('aria-label')) out.push('no label: ' + show(el));
		}
		for (const el of document.querySelectorAll('img')) {
			if (!el.hasAttribute('alt')) out.push('no alt: ' + show(el));
		}
		for (const el of document.querySelectorAll('button, a[href]')) {
			if (!hidden(el) && !(el.getAttribute('aria-label') || el.textContent).trim()) out.push('no name: ' + show(el));
		}
		if (document.querySelectorAll('h1').length !== 1) out.push('not one h1');
		return out;
	})()`))
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s's page %s", u.name, strings.Join(problems, "; "))
	}
	return nil
}

// expectError waits for the error element id to say what the service said.
func (u *browserUser) expectError(id, want string) error {
	got, err := u.waitFor(fmt.Sprintf(`document.getElementById(%q).textContent`, id))
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%s: the page says %q; the service said %q", u.name, got, want)
	}
	return nil
}

// stepper returns step, which runs one step of the test and, should it fail,
// keeps a screenshot of every user's page and says where.
func (br *browser) stepper(t *testing.T) func(name string, fn func() error) {
	return func(name string, fn func() error) {
		t.Helper()
		start := time.Now()
		err := fn()
		if err == nil {
			t.Logf("step %q: %s", name, time.Since(start).Round(time.Millisecond))
			return
		}
		dir, derr := os.MkdirTemp("", "feed-web-test-")
		require.NoError(t, derr)
		for _, u := range br.users {
			ctx, cancel := context.WithTimeout(u.ctx, 10*time.Second)
			shot, serr := chromedp.Run(ctx, chromedp.CaptureScreenshot())
			text, terr := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n\n" + document.body.innerText`))
			cancel()
			if serr != nil || terr != nil {
				t.Logf("no screenshot of %s's page: %v", u.name, errors.Join(serr, terr))
				continue
			}
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s.png", u.name, slug(name))), shot, 0o644)
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s.txt", u.name, slug(name))), []byte(text), 0o644)
		}
		br.mu.Lock()
		fails := slices.Clone(br.fails)
		last := br.outcomes[max(0, len(br.outcomes)-15):]
		br.mu.Unlock()
		t.Fatalf("step %q: %v\na screenshot and the text of each page: %s\nuncaught exceptions: %v\nthe last requests:\n%s",
			name, err, dir, fails, strings.Join(last, "\n"))
	}
}

// checkRequests fails the test if the page made a request outside the
// service, or threw an exception.
func (br *browser) checkRequests(t *testing.T, base string) {
	t.Helper()
	br.mu.Lock()
	defer br.mu.Unlock()
	assert.Greater(t, len(br.urls), 20, "the requests of the pages were recorded")
	for _, u := range br.urls {
		// An image preview is the page's own object URL, never a request.
		if !strings.HasPrefix(u, base+"/") && !strings.HasPrefix(u, "blob:"+base+"/") {
			t.Errorf("the page requested %s, outside the service %s", u, base)
		}
	}
	assert.Empty(t, br.blocked, "requests the page tried, which its content security policy stopped")
	assert.Empty(t, br.fails, "uncaught exceptions in the page")
}

func slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, s)
}

func equalIDs(want []string, got string) error {
	if g := strings.Split(got, ","); !slices.Equal(want, g) {
		return fmt.Errorf("posts on the page:\n%v\nwant:\n%v", g, want)
	}
	return nil
}

func devDataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "feed-dev-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // the postgres user must reach its data dir
	return dir
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, data, 0o644))
	return p
}

// testImage is a PNG of w×h: a sky of two colours that seed picks, with a sun.
func testImage(t *testing.T, seed, w, h int) []byte {
	t.Helper()
	skies := [][2]color.RGBA{
		{{255, 183, 94, 255}, {237, 100, 166, 255}},
		{{58, 123, 213, 255}, {0, 210, 255, 255}},
		{{17, 153, 142, 255}, {56, 239, 125, 255}},
		{{142, 45, 226, 255}, {74, 0, 224, 255}},
		{{252, 74, 26, 255}, {247, 183, 51, 255}},
		{{40, 60, 134, 255}, {69, 162, 71, 255}},
	}
	sky := skies[seed%len(skies)]
	mix := func(a, b uint8, f float64) uint8 { return uint8(float64(a)*(1-f) + float64(b)*f) }
	sunX, sunY, sunR := float64(w)*(0.25+0.1*float64(seed%5)), float64(h)*0.4, float64(min(w, h))/6
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			f := float64(y) / float64(h)
			c := color.RGBA{mix(sky[0].R, sky[1].R, f), mix(sky[0].G, sky[1].G, f), mix(sky[0].B, sky[1].B, f), 255}
			if dx, dy := float64(x)-sunX, float64(y)-sunY; dx*dx+dy*dy < sunR*sunR {
				c = color.RGBA{mix(c.R, 255, .7), mix(c.G, 250, .7), mix(c.B, 220, .7), 255}
			}
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return buf.Bytes()
}

// devToken signs user in through the page's development sign-in.
func devToken(t *testing.T, base, user string) string {
	t.Helper()
	resp, err := http.Post(base+"/dev/token", "application/json", strings.NewReader(`{"user_id":"`+user+`"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct{ Token string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return body.Token
}

// postImages sends POST /posts with images named image-N.png; it returns the
// status and the decoded answer.
func postImages(t *testing.T, base, token, caption string, images [][]byte) (int, map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	require.NoError(t, mw.WriteField("caption", caption))
	for i, img := range images {
		w, err := mw.CreateFormFile("images", "image-"+strconv.Itoa(i)+".png")
		require.NoError(t, err)
		_, _ = w.Write(img)
	}
	require.NoError(t, mw.Close())
	req, err := http.NewRequest(http.MethodPost, base+"/posts", &buf)
	require.NoError(t, err)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var body map[string]any
	require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
	return resp.StatusCode, body
}

func createCaptioned(t *testing.T, base, token, caption string, images ...[]byte) string {
	t.Helper()
	status, body := postImages(t, base, token, caption, images)
	require.Equal(t, http.StatusAccepted, status, "%v", body)
	return body["id"].(string)
}

// apiError is the message of the service's error, of status, for a post of
// images with their names.
func apiError(t *testing.T, base, token string, status int, names []string, images [][]byte) string {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i, img := range images {
		w, err := mw.CreateFormFile("images", names[i])
		require.NoError(t, err)
		_, _ = w.Write(img)
	}
	require.NoError(t, mw.Close())
	req, err := http.NewRequest(http.MethodPost, base+"/posts", &buf)
	require.NoError(t, err)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct{ Error struct{ Message string } }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, status, resp.StatusCode, "%v", body)
	return body.Error.Message
}
