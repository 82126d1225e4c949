package loadbench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

// TestDecodeFeedPageReadsOnlyWhatTheBenchUses: the post ids (a post's own,
// not an id inside its other fields), the cursor and has_more, whatever else
// the page holds and in whatever order.
func TestDecodeFeedPageReadsOnlyWhatTheBenchUses(t *testing.T) {
	page, err := decodeFeedPage([]byte(`{"has_more": true, "posts": [
		{"user_id": "7", "media": [{"id": "99", "url": "/media/x", "width": 24}], "id": "1050", "caption": "a \"b\" }", "edited_at": null},
		{"id": "1041", "has_liked": false, "like_count": 3}
	], "next_cursor": "1041:1732899000", "extra": {"id": "5"}}`))
	require.NoError(t, err)
	require.Equal(t, feedPage{IDs: []domain.PostID{1050, 1041}, NextCursor: "1041:1732899000", HasMore: true}, page)

	page, err = decodeFeedPage([]byte(`{"posts": [], "next_cursor": null, "has_more": false}`))
	require.NoError(t, err)
	require.Equal(t, feedPage{IDs: []domain.PostID{}}, page)

	for _, bad := range []string{
		``, `[]`, `{"posts": {}}`, `{"posts": [{"id": "x"}]}`, `{"posts": [1]}`, `{"posts": [{"id": "1"}]`,
	} {
		_, err := decodeFeedPage([]byte(bad))
		require.Error(t, err, bad)
	}
}
