package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// ErrUnknownType is returned by Decode for a type this build does not know:
// written by a newer version, or never valid. Readers skip and count it.
var ErrUnknownType = errors.New("unknown event type")

// Registry decodes envelopes into typed events by their type name.
type Registry struct {
	decoders map[string]func(json.RawMessage) (Event, error)
}

// NewRegistry returns a registry of every event type of this package.
func NewRegistry() *Registry {
	r := &Registry{decoders: map[string]func(json.RawMessage) (Event, error){}}
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
	r.decoders[name] = func(raw json.RawMessage) (Event, error) {
		var ev T
		if err := json.Unmarshal(raw, &ev); err != nil {
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

// Decode parses a stored message body. For an unknown type it returns the
// envelope, a nil event and an error wrapping ErrUnknownType.
func (r *Registry) Decode(data []byte) (Envelope, Event, error) {
	var env Envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return Envelope{}, nil, fmt.Errorf("decode envelope: %w", err)
	}
	decode, ok := r.decoders[env.Type]
	if !ok {
		return env, nil, fmt.Errorf("event %s of type %q: %w", env.ID, env.Type, ErrUnknownType)
	}
	ev, err := decode(env.Payload)
	if err != nil {
		return env, nil, fmt.Errorf("decode %s payload of event %s: %w", env.Type, env.ID, err)
	}
	return env, ev, nil
}
