package domain

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The contract's limits.
const (
	MaxCaptionChars = 2200
	MaxCommentChars = 2200
	MinImages       = 1
	MaxImages       = 10
	MaxImageBytes   = 5 << 20
	// PageSize is the fixed server-side page size of every list.
	PageSize = 10
)

// ValidateCaption checks a post caption: valid UTF-8 of at most MaxCaptionChars
// characters (code points); empty is allowed.
func ValidateCaption(s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return fmt.Errorf("caption is not valid UTF-8 text: %w", ErrInvalid)
	}
	if n := utf8.RuneCountInString(s); n > MaxCaptionChars {
		return fmt.Errorf("caption has %d characters; the limit is %d: %w", n, MaxCaptionChars, ErrInvalid)
	}
	return nil
}

// ValidateComment checks a comment's text: valid UTF-8, not blank, at most
// MaxCommentChars characters.
func ValidateComment(s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return fmt.Errorf("comment text is not valid UTF-8 text: %w", ErrInvalid)
	}
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("comment text is empty: %w", ErrInvalid)
	}
	if n := utf8.RuneCountInString(s); n > MaxCommentChars {
		return fmt.Errorf("comment text has %d characters; the limit is %d: %w", n, MaxCommentChars, ErrInvalid)
	}
	return nil
}

// ValidateImageCount checks the number of images of a post.
func ValidateImageCount(n int) error {
	if n < MinImages || n > MaxImages {
		return fmt.Errorf("a post has %d to %d images, not %d: %w", MinImages, MaxImages, n, ErrInvalid)
	}
	return nil
}
