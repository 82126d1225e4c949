// Package readmodel is the Postgres read model: the projector that builds its
// tables from the event log, and the store that answers the read side's queries
// (post detail, profile grids, comments, follower lists and the pull feed) from
// them.
package readmodel
