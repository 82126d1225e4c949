package domain_test

import (
	"errors"
	"testing"

	"github.com/feedproject/feed/domain"
)

func TestParseIDs(t *testing.T) {
	valid := map[string]int64{"1": 1, "501": 501, "9007199254740991": 1<<53 - 1}
	for s, want := range valid {
		got, err := domain.ParsePostID(s)
		if err != nil || int64(got) != want {
			t.Errorf("ParsePostID(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0", "-1", "9007199254740992", "1.5", "abc", " 1", "0x10", "99999999999999999999", "+1"} {
		if _, err := domain.ParseUserID(s); !errors.Is(err, domain.ErrInvalid) {
			t.Errorf("ParseUserID(%q) error = %v; want ErrInvalid", s, err)
		}
	}
}
