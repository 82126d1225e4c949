-- lock_checkpoint_at locks a projector's checkpoint row, as a batch does
-- first, and fails with FE001 unless the checkpoint is at expected. A batch
-- the activity projector planned from what it knows of every row, before
-- the batch before it committed (its Send), opens with it, so that it is
-- void unless that one committed and nothing else wrote since. As the read
-- model's (its migration 4).
CREATE FUNCTION lock_checkpoint_at(p_projector text, p_expected bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    found_at bigint;
BEGIN
    SELECT position INTO found_at FROM projector_checkpoints WHERE projector = p_projector FOR UPDATE;
    IF found_at IS DISTINCT FROM p_expected THEN
        RAISE EXCEPTION 'the checkpoint of % is at %, not at %', p_projector, found_at, p_expected
            USING ERRCODE = 'FE001';
    END IF;
    RETURN found_at;
END
$$;
