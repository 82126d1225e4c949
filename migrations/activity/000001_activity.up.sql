-- The activity: what other users did to each user, built by its own projector
-- from the event log. Everything here is derived: dropping it and replaying the
-- log from sequence 1 rebuilds it row for row.

-- The activity projector's position in the event log, advanced in the same
-- transaction as its changes.
CREATE TABLE projector_checkpoints (
    projector  text        PRIMARY KEY,
    position   bigint      NOT NULL CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The live posts: whose a like or a comment is, and the thumbnail its item
-- shows. A deleted post's row goes, so later events about it make no item.
CREATE TABLE posts (
    id           bigint  PRIMARY KEY,
    user_id      bigint  NOT NULL,
    media_key    text,
    content_type text,
    width        integer,
    height       integer
);

-- One row per item of a user's activity. id is the log position of the
-- action that made it (for a repeated follow or like, the first of its run),
-- so a user's items are newest first by id and an item made after position P
-- has an id above P. A follow has no post_id; a like has no comment_id.
-- kept is false for a follow or like beyond the newest items a user keeps: the
-- row stays, unseen, as the memory that the follow or like stands, so that
-- repeating it makes no new item.
CREATE TABLE items (
    owner_id   bigint      NOT NULL,
    id         bigint      NOT NULL,
    actor_id   bigint      NOT NULL,
    post_id    bigint,
    comment_id bigint,
    text       text,
    created_at timestamptz NOT NULL,
    kept       boolean     NOT NULL DEFAULT true,
    PRIMARY KEY (owner_id, id),
    CHECK (owner_id <> actor_id)
);
-- A follow's item by its pair.
CREATE UNIQUE INDEX items_follows ON items (owner_id, actor_id) WHERE post_id IS NULL;
-- A like's item by its pair; a post's items, which leave with it.
CREATE INDEX items_by_post ON items (post_id, actor_id) WHERE post_id IS NOT NULL;
