DROP FUNCTION lock_checkpoint_at(text, bigint);
