// Package events is the system of record: the domain events, their envelope and
// versioned type names, the registry that decodes them, and the JetStream stream
// they are appended to and read back from.
package events
