package events

// DecodeWritten and DecodeGeneral are Decode's two paths, for tests that hold
// one to the other.
var DecodeWritten = decodeWritten

func (r *Registry) DecodeGeneral(data []byte) (Envelope, Event, error) { return r.decode(data) }
