// Package pgschema keeps a projector's state in a Postgres schema of its own:
// it rebuilds the state in a shadow schema beside the live one and swaps their
// names in one transaction, and it tells a failure to reach Postgres from a
// failure of a statement.
package pgschema
