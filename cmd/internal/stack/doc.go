// Package stack is what the feed command and its load bench know of a
// deployment: its configuration from the environment, the addresses of its
// servers, and how far its projectors are.
package stack
