package events

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/feedproject/feed/domain"
)

// ErrUnknownType is returned by Decode for a type this build does not know:
// written by a newer version, or never valid. Readers skip and count it.
var ErrUnknownType = errors.New("unknown event type")

// Registry decodes envelopes into typed events by their type name.
type Registry struct {
	decoders map[string]func(*jsontext.Decoder) (Event, error)
}

// NewRegistry returns a registry of every event type of this package.
func NewRegistry() *Registry {
	r := &Registry{decoders: map[string]func(*jsontext.Decoder) (Event, error){}}
	register[PostCreated](r, TypePostCreated)
	register[PostEdited](r, TypePostEdited)
	register[PostDeleted](r, TypePostDeleted)
	register[UserFollowed](r, TypeUserFollowed)
	register[UserUnfollowed](r, TypeUserUnfollowed)
	register[PostLiked](r, TypePostLiked)
	register[PostUnliked](r, TypePostUnliked)
	register[CommentAdded](r, TypeCommentAdded)
	return r
}

func register[T Event](r *Registry, name string) {
	r.decoders[name] = func(dec *jsontext.Decoder) (Event, error) {
		var ev T
		if err := json.UnmarshalDecode(dec, &ev, decodeOptions); err != nil {
			return nil, err
		}
		return ev, nil
	}
}

// Types lists the registered type names, sorted.
func (r *Registry) Types() []string {
	names := make([]string, 0, len(r.decoders))
	for name := range r.decoders {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Known reports whether name is a registered type.
func (r *Registry) Known(name string) bool {
	_, ok := r.decoders[name]
	return ok
}

// decodeOptions make the decoder accept exactly what encoding/json accepts,
// which wrote (and still writes) every stored envelope; but, reporting errors
// as it meets them, it reads the body once rather than validate it first.
var decodeOptions = json.JoinOptions(jsonv1.DefaultOptionsV1(), jsonv1.ReportErrorsWithLegacySemantics(false))

// Decode parses a stored message body. For an unknown type it returns the
// envelope, a nil event and an error wrapping ErrUnknownType.
//
// It is the projectors' hot path. A body as the log's writers store it is
// read by decodeWritten, which knows its layout; any other by decode.
func (r *Registry) Decode(data []byte) (Envelope, Event, error) {
	if env, ev, ok := decodeWritten(data); ok {
		return env, ev, nil
	}
	return r.decode(data)
}

// decode parses any body encoding/json would, reading it once: json.Marshal
// writes the type before the payload, and the payload is decoded into its
// event type where it stands (see payload), rather than copied out, checked
// and scanned again as a second document.
func (r *Registry) decode(data []byte) (Envelope, Event, error) {
	w := wires.Get().(*wire)
	defer wires.Put(w)
	*w = wire{Payload: payload{registry: r, body: data}}
	w.Payload.typ = &w.Type
	err := json.Unmarshal(data, w, decodeOptions)
	env := Envelope{ID: w.ID, Type: w.Type, OccurredAt: w.OccurredAt, Actor: w.Actor, Payload: w.Payload.raw}
	if err != nil {
		var perr *payloadError
		if errors.As(err, &perr) {
			return env, nil, fmt.Errorf("decode %s payload of event %s: %w", env.Type, env.ID, perr.err)
		}
		return Envelope{}, nil, fmt.Errorf("decode envelope: %w", err)
	}
	ev := w.Payload.ev
	if ev == nil || ev.Type() != env.Type {
		decode, ok := r.decoders[env.Type]
		if !ok {
			return env, nil, fmt.Errorf("event %s of type %q: %w", env.ID, env.Type, ErrUnknownType)
		}
		// The type came after the payload (not as json.Marshal writes it),
		// or the payload is missing: decode it now, on its own.
		if ev, err = decode(jsontext.NewDecoder(bytes.NewReader(env.Payload), decodeOptions)); err != nil {
			return env, nil, fmt.Errorf("decode %s payload of event %s: %w", env.Type, env.ID, err)
		}
	}
	return env, ev, nil
}

// wires holds the values Decode decodes into: one would otherwise be
// allocated per event, the largest allocation of decoding.
var wires = sync.Pool{New: func() any { return new(wire) }}

// wire is Envelope as decoded: the same fields, with the payload decoded as
// it is read.
type wire struct {
	ID         string        `json:"id"`
	Type       string        `json:"type"`
	OccurredAt time.Time     `json:"occurred_at"`
	Actor      domain.UserID `json:"actor,string"`
	Payload    payload       `json:"payload"`
}

// payload decodes an envelope's payload into the event of the type read
// before it, if any, and keeps its bytes (a slice of the body, not a copy).
type payload struct {
	registry *Registry
	typ      *string // the envelope's type, as far as decoded
	body     []byte
	raw      []byte
	ev       Event
}

// payloadError tells a payload that is not its type's from an envelope that
// is not one.
type payloadError struct{ err error }

func (e *payloadError) Error() string { return e.err.Error() }

// UnmarshalJSONFrom implements json.UnmarshalerFrom.
func (p *payload) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	start := dec.InputOffset()
	// A repeated payload replaces the first, as a repeated name does.
	p.ev = nil
	if decode, ok := p.registry.decoders[*p.typ]; ok {
		ev, err := decode(dec)
		var syntax *jsontext.SyntacticError
		if errors.As(err, &syntax) {
			return err // not JSON: the envelope is broken
		}
		if err != nil {
			return &payloadError{err}
		}
		p.ev = ev
	} else if err := dec.SkipValue(); err != nil {
		return err
	}
	// The offsets count from the start of body, the decoder's only input;
	// start is the end of the member's name, before the colon.
	p.raw = bytes.TrimLeft(p.body[start:dec.InputOffset()], ": \t\r\n")
	return nil
}
