DROP FUNCTION advance_checkpoint(text, bigint, bigint);
ALTER TABLE projector_checkpoints DROP COLUMN epoch;
