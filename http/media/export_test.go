package media

// SetSegmentSize makes p start a new pack past n bytes.
func SetSegmentSize(p *Pack, n int64) { p.segmentSize = n }

// MemoryLimit is how much of an upload is held in memory.
const MemoryLimit = memoryLimit
