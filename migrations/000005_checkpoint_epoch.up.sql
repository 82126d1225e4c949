-- The epoch of the lease under which a projector last moved its checkpoint
-- (0: none). A process that lost its lease, and with it the role, may still
-- be finishing a batch; its write of the checkpoint is refused once a newer
-- holder has written, and its whole transaction with it.
ALTER TABLE projector_checkpoints ADD COLUMN epoch bigint NOT NULL DEFAULT 0;

-- advance_checkpoint moves a projector's checkpoint to p_position under the
-- lease epoch p_epoch, and fails with FE002 if a newer epoch wrote it.
CREATE FUNCTION advance_checkpoint(p_projector text, p_position bigint, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    fenced_at bigint;
BEGIN
    UPDATE projector_checkpoints SET position = p_position, epoch = p_epoch, updated_at = now()
        WHERE projector = p_projector AND epoch <= p_epoch;
    IF NOT FOUND THEN
        SELECT epoch INTO fenced_at FROM projector_checkpoints WHERE projector = p_projector;
        RAISE EXCEPTION 'the checkpoint of % was written under epoch %, above this writer''s %', p_projector, fenced_at, p_epoch
            USING ERRCODE = 'FE002';
    END IF;
END
$$;
