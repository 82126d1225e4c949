package activity

// ErrBatchBefore is errBatchBefore, for the tests.
var ErrBatchBefore = errBatchBefore

// SetCatchUpBatch sets the smallest batch p plans from memory.
func SetCatchUpBatch(p *Projector, n int) { p.catchUp = n }
