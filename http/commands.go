package http

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"mime/multipart"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// Limits on request bodies, enforced before a body is held in memory.
const (
	// maxJSONBody bounds the JSON commands (a caption or comment of 2200
	// characters of up to 4 bytes each, escaped, fits well within it).
	maxJSONBody = 64 << 10
	// maxPostBody bounds POST /posts: ten images at the limit and the form's own
	// bytes.
	maxPostBody = domain.MaxImages*domain.MaxImageBytes + 1<<20
	// maxPartHead bounds the bytes before a form part's content: its
	// boundary and headers (a few hundred bytes from any browser), or the
	// form's preamble.
	maxPartHead = 64 << 10
	// maxCaptionBytes is the most bytes a valid caption can take.
	maxCaptionBytes = domain.MaxCaptionChars * 4
	// occAttempts bounds the retries of an edit or delete that lost a race.
	occAttempts = 10
	// logTimeout bounds each exchange with the log, so a log that is down is a
	// prompt 503 rather than a hung request.
	logTimeout = 5 * time.Second
)

// commands handles the write side of the contract: each command is validated,
// its media stored, and one event appended; the answer is 202 with its position.
type commands struct {
	log   *events.Log
	media media.Store
	ids   *domain.IDGenerator
	now   func() time.Time
	// owners remembers posts' owners (a post's never changes), so that a
	// post's events are found by their exact subject: a wildcard in the owner's
	// place makes the server walk every user's subjects, which cost likes and
	// comments more than a millisecond each on a log of 100 000 follows.
	owners *lru.Cache[domain.PostID, domain.UserID]
}

// ownersCached bounds commands.owners (about 100 bytes an entry).
const ownersCached = 100_000

func newCommands(deps Deps) *commands {
	owners, err := lru.New[domain.PostID, domain.UserID](ownersCached)
	if err != nil {
		panic(err) // only for a size below 1
	}
	return &commands{log: deps.Log, media: deps.Media, ids: deps.IDs, now: deps.Now, owners: owners}
}

// eventID is the envelope id of a command's event. With an Idempotency-Key it is
// derived from the user and the key, so a retry is deduplicated by the log;
// otherwise it is a fresh, time-ordered UUID.
func eventID(c *fiber.Ctx, user domain.UserID) (id string, idempotent bool, err error) {
	key := c.Get("Idempotency-Key")
	if key == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return "", false, fmt.Errorf("event id: %w", err)
		}
		return u.String(), false, nil
	}
	if len(key) > 255 || strings.ContainsFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return "", false, fmt.Errorf("Idempotency-Key must be 1 to 255 visible ASCII characters: %w", domain.ErrInvalid)
	}
	sum := sha256.Sum256([]byte(user.String() + "\x00" + key))
	return "idem-" + hex.EncodeToString(sum[:16]), true, nil
}

// appendEvent appends ev under id and returns the event the client's answer is
// about: ev itself, or for a retried Idempotency-Key the event first appended
// with it.
func (h *commands) appendEvent(ctx context.Context, id string, ev events.Event, opts ...events.AppendOption) (uint64, events.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, logTimeout)
	defer cancel()
	res, err := h.log.AppendEvent(ctx, id, h.now(), ev, opts...)
	if err != nil {
		return 0, nil, err
	}
	if !res.Duplicate {
		return res.Seq, ev, nil
	}
	// The append may have used up ctx finding out its outcome.
	getCtx, cancelGet := context.WithTimeout(context.WithoutCancel(ctx), logTimeout)
	defer cancelGet()
	first, err := h.log.Get(getCtx, res.Seq)
	if errors.Is(err, domain.ErrUnavailable) {
		// Something is stored under this id: never a 503.
		return 0, nil, fmt.Errorf("%w: event %d: load the first answer of a retried command: %v", domain.ErrOutcomeUnknown, res.Seq, err)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("load the first answer of a retried command: %w", err)
	}
	if err := sameCommand(first, ev); err != nil {
		return 0, nil, err
	}
	return first.Seq, first.Event, nil
}

// errKeyReused is a retry whose command differs from the first one sent
// under its Idempotency-Key.
var errKeyReused = fmt.Errorf("this Idempotency-Key was already used for a different command or body; "+
	"use a new key for a new command: %w", domain.ErrConflict)

// sameCommand fails with errKeyReused unless first, appended under a
// command's event id, is the event the command would append now: the same
// type and content, but for what the service generates (ids and times).
func sameCommand(first events.Record, ev events.Event) error {
	if first.Event == nil || first.Type != ev.Type() || !reflect.DeepEqual(intent(first.Event), intent(ev)) {
		return errKeyReused
	}
	return nil
}

// intent is ev without what the service generates for it.
func intent(ev events.Event) events.Event {
	switch e := ev.(type) {
	case events.PostCreated:
		e.PostID, e.CreatedAt = 0, time.Time{}
		return e
	case events.PostEdited:
		e.EditedAt = time.Time{}
		return e
	case events.PostDeleted:
		e.DeletedAt = time.Time{}
		return e
	case events.CommentAdded:
		e.CommentID, e.CreatedAt = 0, time.Time{}
		return e
	}
	return ev
}

// accepted writes the 202 answer for the event at seq.
func accepted(c *fiber.Ctx, seq uint64, ev events.Event) error {
	body := fiber.Map{"position": events.Position(seq)}
	switch e := ev.(type) {
	case events.PostCreated:
		body["id"] = e.PostID.String()
		body["created_at"] = formatTime(e.CreatedAt)
		c.Set(fiber.HeaderLocation, "/posts/"+e.PostID.String())
	case events.CommentAdded:
		body["id"] = e.CommentID.String()
	}
	return c.Status(fiber.StatusAccepted).JSON(body)
}

// timeLayout is the contract's times: RFC 3339, UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// formatTime writes times as the contract does (timeLayout).
func formatTime(t time.Time) string {
	return t.UTC().Format(timeLayout)
}

func (h *commands) createPost(c *fiber.Ctx) error {
	p, _ := principal(c)
	id, _, err := eventID(c, p.UserID)
	if err != nil {
		return err
	}
	caption, images, err := h.readPostForm(c)
	if err != nil {
		return err
	}
	// Only durable images may be referred to; the uploads that arrive together
	// share one sync (group commit).
	if err := h.media.Sync(c.UserContext()); err != nil {
		return err
	}
	postID, createdAt := h.ids.Next(h.now())
	ev := events.PostCreated{
		PostID:    domain.PostID(postID),
		UserID:    p.UserID,
		Caption:   caption,
		CreatedAt: createdAt,
		Media:     make([]events.Media, len(images)),
	}
	for i, img := range images {
		ev.Media[i] = events.Media{Key: img.Key, ContentType: img.ContentType, Width: img.Width, Height: img.Height, Size: img.Size}
	}
	// The images are stored and synced; only now may an event refer to them. If
	// the append fails there is no post, only images nothing refers to.
	seq, first, err := h.appendEvent(c.UserContext(), id, ev)
	if err != nil {
		return err
	}
	if pc, ok := first.(events.PostCreated); ok {
		h.owners.Add(pc.PostID, pc.UserID)
	}
	return accepted(c, seq, first)
}

// readPostForm streams the multipart form of POST /posts: each image goes to the
// media store as it arrives, so no image is held in memory whole, and the
// contract's limits are checked on the way.
func (h *commands) readPostForm(c *fiber.Ctx) (string, []media.Image, error) {
	mediaType, params, err := mime.ParseMediaType(c.Get(fiber.HeaderContentType))
	if err != nil || mediaType != fiber.MIMEMultipartForm || params["boundary"] == "" {
		return "", nil, fmt.Errorf("POST /posts takes multipart/form-data with caption and images: %w", domain.ErrUnsupportedMedia)
	}
	body, err := requestBody(c, maxPostBody)
	if err != nil {
		return "", nil, err
	}
	heads := &partHeads{r: body}
	form := multipart.NewReader(heads, params["boundary"])
	var (
		caption    string
		hasCaption bool
		images     []media.Image
	)
	for {
		heads.left = maxPartHead
		part, err := form.NextPart()
		heads.left = -1
		if errors.Is(err, io.EOF) {
			break
		}
		if heads.over {
			return "", nil, fmt.Errorf("the form's preamble or the headers of part %d are over %d bytes: %w",
				len(images)+1, maxPartHead, domain.ErrTooLarge)
		}
		if err != nil {
			return "", nil, bodyError(body, fmt.Errorf("malformed multipart body: %v: %w", err, domain.ErrInvalid))
		}
		switch part.FormName() {
		case "caption":
			if hasCaption {
				return "", nil, fmt.Errorf("caption given twice: %w", domain.ErrInvalid)
			}
			hasCaption = true
			b, err := io.ReadAll(io.LimitReader(part, maxCaptionBytes+1))
			if err != nil {
				return "", nil, bodyError(body, fmt.Errorf("read caption: %v: %w", err, domain.ErrInvalid))
			}
			caption = string(b)
			if len(b) > maxCaptionBytes {
				return "", nil, fmt.Errorf("caption is over %d characters: %w", domain.MaxCaptionChars, domain.ErrInvalid)
			}
			if err := domain.ValidateCaption(caption); err != nil {
				return "", nil, err
			}
		case "images":
			if len(images) == domain.MaxImages {
				return "", nil, domain.ValidateImageCount(domain.MaxImages + 1)
			}
			src := &readErrors{r: part}
			img, err := h.media.Save(c.UserContext(), src, domain.MaxImageBytes)
			if err != nil {
				if src.err != nil && !errors.Is(err, domain.ErrTooLarge) {
					// The client's body broke off or is malformed, not the store.
					err = fmt.Errorf("malformed multipart body: %v: %w", src.err, domain.ErrInvalid)
				}
				return "", nil, bodyError(body, fmt.Errorf("image %d: %w", len(images)+1, err))
			}
			images = append(images, img)
		default:
			return "", nil, fmt.Errorf("unknown form field %q (expected caption and images): %w", part.FormName(), domain.ErrInvalid)
		}
		_ = part.Close()
	}
	if err := domain.ValidateImageCount(len(images)); err != nil {
		return "", nil, err
	}
	// The epilogue, and a chunked body's last chunk: read to the end, the
	// connection can carry the next request.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return "", nil, bodyError(body, fmt.Errorf("read the end of the form: %v: %w", err, domain.ErrInvalid))
	}
	return caption, images, nil
}

// partHeads bounds what the multipart reader reads while it looks for the
// next part and reads the part's headers (left >= 0): it holds those in
// memory, up to 10 MiB a part by its own limit.
type partHeads struct {
	r    io.Reader
	left int64 // -1 while a part's content is read
	over bool
}

func (h *partHeads) Read(p []byte) (int, error) {
	if h.left < 0 {
		return h.r.Read(p)
	}
	if h.left == 0 {
		h.over = true
		return 0, errPartHeadTooLarge
	}
	if int64(len(p)) > h.left {
		p = p[:h.left]
	}
	n, err := h.r.Read(p)
	h.left -= int64(n)
	return n, err
}

var errPartHeadTooLarge = fmt.Errorf("form part headers too large: %w", domain.ErrTooLarge)

// readErrors remembers the error its reader returned, other than io.EOF, so a
// failure of the request body can be told from one of the media store.
type readErrors struct {
	r   io.Reader
	err error
}

func (r *readErrors) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		r.err = err
	}
	return n, err
}

// readJSON decodes a small JSON body into v, strictly: unknown fields, trailing
// data and bodies over maxJSONBody are refused.
func readJSON(c *fiber.Ctx, v any) error {
	if ct := c.Get(fiber.HeaderContentType); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || (mt != fiber.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
			return fmt.Errorf("body must be application/json, not %q: %w", ct, domain.ErrUnsupportedMedia)
		}
	}
	body, err := requestBody(c, maxJSONBody)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return bodyError(body, fmt.Errorf("read body: %v: %w", err, domain.ErrInvalid))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("body is not the expected JSON object: %v: %w", err, domain.ErrInvalid)
	}
	if dec.More() {
		return fmt.Errorf("body has data after the JSON object: %w", domain.ErrInvalid)
	}
	return nil
}

// livePost returns the newest event of a post that exists and is not deleted,
// with its owner, from the post's own events in the log, as the stream's
// leader has them if fromLeader.
func (h *commands) livePost(ctx context.Context, id domain.PostID, fromLeader bool) (events.Record, domain.UserID, error) {
	ctx, cancel := context.WithTimeout(ctx, logTimeout)
	defer cancel()
	subject := events.PostSubjectAnyOwner(id)
	if owner, ok := h.owners.Get(id); ok {
		subject = events.Subject(owner, events.KindPost, int64(id))
	}
	read := h.log.Last
	if fromLeader {
		read = h.log.LeaderLast
	}
	last, err := read(ctx, subject)
	if err != nil {
		if errors.Is(err, domain.ErrNotFound) {
			return events.Record{}, 0, fmt.Errorf("post %d: %w", id, domain.ErrNotFound)
		}
		return events.Record{}, 0, err
	}
	owner, err := subjectActor(last.Subject)
	if err != nil {
		return events.Record{}, 0, err
	}
	h.owners.Add(id, owner)
	if last.Type == events.TypePostDeleted {
		return last, owner, fmt.Errorf("post %d was deleted: %w", id, domain.ErrNotFound)
	}
	return last, owner, nil
}

// subjectActor reads the actor token of an event subject.
func subjectActor(subject string) (domain.UserID, error) {
	tokens := strings.SplitN(subject, ".", 4)
	if len(tokens) != 4 {
		return 0, fmt.Errorf("malformed event subject %q", subject)
	}
	n, err := strconv.ParseInt(tokens[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("malformed event subject %q: %w", subject, err)
	}
	return domain.UserID(n), nil
}

// changePost appends the owner's edit or delete of a post, decided from the
// post's own events and appended only if no other event reached the post in
// between (optimistic concurrency); a lost race is decided again from the new
// state, so concurrent deletes or an edit racing a delete have one outcome.
func (h *commands) changePost(c *fiber.Ctx, change func(owner domain.UserID, id domain.PostID, at time.Time) events.Event) error {
	p, _ := principal(c)
	id, err := domain.ParsePostID(c.Params("id"))
	if err != nil {
		return err
	}
	evID, idempotent, err := eventID(c, p.UserID)
	if err != nil {
		return err
	}
	ctx := c.UserContext()
	for attempt := range occAttempts {
		if attempt > 0 {
			// Spread the losers of a race out so one of them wins the next round.
			time.Sleep(time.Duration(rand.Int64N(int64(attempt) * int64(time.Millisecond))))
		}
		// A lost race is decided again from the leader's state: a replica
		// that lags would lose it again.
		last, owner, err := h.livePost(ctx, id, attempt > 0)
		// The log checks the expected sequence before the dedup id, so a retry of
		// a change that was appended is recognised here, by its id.
		if idempotent && last.ID == evID && (err == nil || errors.Is(err, domain.ErrNotFound)) {
			if err := sameCommand(last, change(owner, id, h.now())); err != nil {
				return err
			}
			return accepted(c, last.Seq, last.Event)
		}
		if err != nil {
			return err
		}
		if owner != p.UserID {
			return fmt.Errorf("post %d belongs to another user: %w", id, domain.ErrForbidden)
		}
		ev := change(owner, id, h.now())
		seq, first, err := h.appendEvent(ctx, evID, ev, events.ExpectSubjectSeq(last.Seq))
		if errors.Is(err, domain.ErrConflict) && !errors.Is(err, errKeyReused) {
			continue // another change got there first: decide again
		}
		if err != nil {
			return err
		}
		return accepted(c, seq, first)
	}
	return fmt.Errorf("post %d is changing too fast; retry: %w", id, domain.ErrConflict)
}

type editBody struct {
	Caption *string `json:"caption"`
}

func (h *commands) editPost(c *fiber.Ctx) error {
	var body editBody
	if err := readJSON(c, &body); err != nil {
		return err
	}
	if body.Caption == nil {
		return fmt.Errorf("caption is required: %w", domain.ErrInvalid)
	}
	if err := domain.ValidateCaption(*body.Caption); err != nil {
		return err
	}
	return h.changePost(c, func(owner domain.UserID, id domain.PostID, at time.Time) events.Event {
		return events.PostEdited{PostID: id, UserID: owner, Caption: *body.Caption, EditedAt: at.UTC().Truncate(time.Millisecond)}
	})
}

func (h *commands) deletePost(c *fiber.Ctx) error {
	return h.changePost(c, func(owner domain.UserID, id domain.PostID, at time.Time) events.Event {
		return events.PostDeleted{PostID: id, UserID: owner, DeletedAt: at.UTC().Truncate(time.Millisecond)}
	})
}

func (h *commands) follow(c *fiber.Ctx) error   { return h.followCommand(c, true) }
func (h *commands) unfollow(c *fiber.Ctx) error { return h.followCommand(c, false) }

func (h *commands) followCommand(c *fiber.Ctx, follow bool) error {
	p, _ := principal(c)
	target, err := domain.ParseUserID(c.Params("id"))
	if err != nil {
		return err
	}
	if target == p.UserID {
		return fmt.Errorf("you cannot follow or unfollow yourself: %w", domain.ErrInvalid)
	}
	var ev events.Event = events.UserFollowed{FollowerID: p.UserID, FolloweeID: target}
	if !follow {
		ev = events.UserUnfollowed{FollowerID: p.UserID, FolloweeID: target}
	}
	return h.appendAndAnswer(c, p.UserID, ev)
}

// appendAndAnswer appends a command's one event under the request's event id
// and answers 202 (for a retried Idempotency-Key, the first answer).
func (h *commands) appendAndAnswer(c *fiber.Ctx, user domain.UserID, ev events.Event) error {
	id, _, err := eventID(c, user)
	if err != nil {
		return err
	}
	seq, first, err := h.appendEvent(c.UserContext(), id, ev)
	if err != nil {
		return err
	}
	return accepted(c, seq, first)
}

func (h *commands) like(c *fiber.Ctx) error   { return h.likeCommand(c, true) }
func (h *commands) unlike(c *fiber.Ctx) error { return h.likeCommand(c, false) }

func (h *commands) likeCommand(c *fiber.Ctx, like bool) error {
	p, _ := principal(c)
	post, err := domain.ParsePostID(c.Params("id"))
	if err != nil {
		return err
	}
	if _, _, err := h.livePost(c.UserContext(), post, false); err != nil {
		return err
	}
	var ev events.Event = events.PostLiked{UserID: p.UserID, PostID: post}
	if !like {
		ev = events.PostUnliked{UserID: p.UserID, PostID: post}
	}
	return h.appendAndAnswer(c, p.UserID, ev)
}

type commentBody struct {
	Text *string `json:"text"`
}

func (h *commands) comment(c *fiber.Ctx) error {
	p, _ := principal(c)
	post, err := domain.ParsePostID(c.Params("id"))
	if err != nil {
		return err
	}
	var body commentBody
	if err := readJSON(c, &body); err != nil {
		return err
	}
	if body.Text == nil {
		return fmt.Errorf("text is required: %w", domain.ErrInvalid)
	}
	if err := domain.ValidateComment(*body.Text); err != nil {
		return err
	}
	if _, _, err := h.livePost(c.UserContext(), post, false); err != nil {
		return err
	}
	commentID, createdAt := h.ids.Next(h.now())
	ev := events.CommentAdded{CommentID: domain.CommentID(commentID), PostID: post, UserID: p.UserID, Text: *body.Text, CreatedAt: createdAt}
	return h.appendAndAnswer(c, p.UserID, ev)
}

// serveMedia serves a stored image; keys are content hashes, so the answer never
// changes and may be cached for ever.
func (h *commands) serveMedia(c *fiber.Ctx) error {
	r, img, err := h.media.Open(c.UserContext(), c.Params("key"))
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, img.ContentType)
	c.Set(fiber.HeaderCacheControl, "public, max-age=31536000, immutable")
	c.Set(fiber.HeaderETag, `"`+img.Key+`"`)
	c.Set("X-Content-Type-Options", "nosniff")
	if match := c.Get(fiber.HeaderIfNoneMatch); match == `"`+img.Key+`"` {
		_ = r.Close()
		return c.SendStatus(fiber.StatusNotModified)
	}
	return c.SendStream(r, int(img.Size))
}
