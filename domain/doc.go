// Package domain holds the news feed's core vocabulary — users, posts, follows,
// likes and comments, their limits, and the categories of failure — with no
// dependency outside the standard library, so every other package can share it.
package domain
