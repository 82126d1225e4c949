package inbox

// Layout decodes an inbox's layout member.
func Layout(m string) (gen string, head, tail, below int64, ok bool) { return layout(m) }
