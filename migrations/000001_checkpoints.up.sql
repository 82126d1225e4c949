-- Each projector's position in the event log, advanced in the same transaction as
-- the read-model changes it made, so an event is applied exactly once in effect.
CREATE TABLE projector_checkpoints (
    projector  text        PRIMARY KEY,
    position   bigint      NOT NULL CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
