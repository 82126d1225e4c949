-- The read model: what the Postgres projector builds from the event log.
-- Everything here is derived: dropping it and replaying the log from sequence 1
-- rebuilds it row for row.

-- Posts. Ids are time-ordered (created_at is the time in the id), so ordering by
-- id is ordering by (created_at, id). A deleted post keeps its row (soft
-- delete); every later event about it is ignored.
CREATE TABLE posts (
    id            bigint      PRIMARY KEY,
    user_id       bigint      NOT NULL,
    caption       text        NOT NULL,
    created_at    timestamptz NOT NULL,
    edited_at     timestamptz,
    deleted_at    timestamptz,
    like_count    integer     NOT NULL DEFAULT 0 CHECK (like_count >= 0),
    comment_count integer     NOT NULL DEFAULT 0 CHECK (comment_count >= 0)
);
-- Profile grids and the pull feed: a user's live posts, newest first.
CREATE INDEX posts_by_author ON posts (user_id, id DESC) WHERE deleted_at IS NULL;

-- A post's images; position 0 is the thumbnail.
CREATE TABLE post_media (
    post_id      bigint   NOT NULL REFERENCES posts (id),
    position     smallint NOT NULL CHECK (position BETWEEN 0 AND 9),
    media_key    text     NOT NULL,
    content_type text     NOT NULL,
    width        integer  NOT NULL,
    height       integer  NOT NULL,
    size         bigint   NOT NULL,
    PRIMARY KEY (post_id, position)
);

-- Who follows whom. created_at is the time of the follow truncated to the second,
-- so the <user_id>:<unix_seconds> cursor of follower lists is an exact keyset.
CREATE TABLE follows (
    follower_id bigint      NOT NULL,
    followee_id bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (follower_id, followee_id),
    CHECK (follower_id <> followee_id)
);
-- Followers of a user (fan-out, follower lists), newest first.
CREATE INDEX follows_by_followee ON follows (followee_id, created_at DESC, follower_id DESC);
-- Accounts a user follows, newest first.
CREATE INDEX follows_by_follower ON follows (follower_id, created_at DESC, followee_id DESC);

-- One row per (post, user) like; like_count on the post is their number.
CREATE TABLE likes (
    post_id bigint NOT NULL,
    user_id bigint NOT NULL,
    PRIMARY KEY (post_id, user_id)
);

-- Comments, oldest first per post (ids are time-ordered too).
CREATE TABLE comments (
    id         bigint      PRIMARY KEY,
    post_id    bigint      NOT NULL,
    user_id    bigint      NOT NULL,
    text       text        NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX comments_by_post ON comments (post_id, id);
