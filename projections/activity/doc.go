// Package activity is each user's activity: what other users did to them
// (followed them, liked or commented on their posts), built from the whole
// event log by a projector of its own into a Postgres schema of its own, and
// read newest first a page at a time.
package activity
