package activity

// ErrBatchBefore is errBatchBefore, for the tests.
var ErrBatchBefore = errBatchBefore
