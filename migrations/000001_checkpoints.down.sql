DROP TABLE IF EXISTS projector_checkpoints;
