package readmodel

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/migrations"
)

// TestBatchStatementsNeedNoStatistics plans the statements that look rows up
// by key on tables a replay has filled but nobody has analysed, small and
// large: each must find its rows by index, for a scan of a whole table per
// batch makes a replay quadratic. Each is planned as a prepared statement is
// after its first executions (generic) and as it is before (custom), in the
// transaction of a batch.
func TestBatchStatementsNeedNoStatistics(t *testing.T) {
	ctx := context.Background()
	pool, err := OpenPool(ctx, localstacktest.PostgresForTest(t).URL(), migrations.Schema, 0)
	require.NoError(t, err)
	defer pool.Close()
	for _, table := range []string{"posts", "likes", "follows"} {
		_, err := pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
	}
	// Arrays of a batch's size, as literals: EXECUTE takes no subqueries.
	array := func(elem func(i int) string) string {
		var b strings.Builder
		b.WriteString("'{")
		for i := range 700 {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(elem(i))
		}
		b.WriteString("}'")
		return b.String()
	}
	ids := array(func(i int) string { return strconv.Itoa(1 + 37*i) })
	texts := array(func(int) string { return "x" })
	times := array(func(int) string { return `"2026-11-22 10:00:00+00"` })
	ints := array(func(int) string { return "1" })
	from := 1
	for _, rows := range []int{2000, 30000} {
		for _, q := range []string{
			`INSERT INTO posts (id, user_id, caption, created_at, deleted_at)
				SELECT g, g % 2000, 'post', now(), CASE WHEN g % 30 = 0 THEN now() END FROM generate_series($1::int, $2) g`,
			`INSERT INTO likes (post_id, user_id) SELECT g, g % 2000 FROM generate_series($1::int, $2) g`,
			`INSERT INTO follows (follower_id, followee_id, created_at) SELECT g, g + 1, now() FROM generate_series($1::int, $2) g`,
		} {
			_, err := pool.Exec(ctx, q, from, rows)
			require.NoError(t, err, q)
		}
		from = rows + 1
		for _, c := range []struct {
			stmt string
			args []string
		}{
			{readPosts, []string{ids}},
			{readLikes, []string{ids, ids}},
			{readFollows, []string{ids, ids}},
			{bulkChanges, []string{ids, texts, times, times, ints, ints}},
			{bulkUnlikes, []string{ids, ids}},
			{bulkRefollows, []string{ids, ids, times}},
			{bulkUnfollows, []string{ids, ids}},
		} {
			for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
				plan := explain(t, pool, c.stmt, c.args, mode)
				assert.Regexp(t, `Index (Only )?Scan using`, plan, "%d rows, %s: %s\n%s", rows, mode, c.stmt, plan)
				for _, bad := range []string{"Seq Scan", "Bitmap", "Hash"} {
					assert.NotContains(t, plan, bad, "%d rows, %s: %s\n%s", rows, mode, c.stmt, plan)
				}
			}
		}
	}
}

// explain is the plan of stmt executed with args (SQL expressions) as a
// prepared statement planned in mode (plan_cache_mode), after planWrites in
// its transaction.
func explain(t *testing.T, pool *pgxpool.Pool, stmt string, args []string, mode string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{planWrites, "SET LOCAL plan_cache_mode = " + mode, "PREPARE q AS " + stmt} {
		_, err := tx.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	rows, err := tx.Query(ctx, "EXPLAIN EXECUTE q("+strings.Join(args, ", ")+")")
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "DEALLOCATE q")
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// TestPlanReset fills every column of a plan with a row and checks that reset
// empties each, keeping its memory.
func TestPlanReset(t *testing.T) {
	var pl plan
	var columns func(v reflect.Value, path string, f func(reflect.Value, string))
	columns = func(v reflect.Value, path string, f func(reflect.Value, string)) {
		for i := range v.NumField() {
			field, name := v.Field(i), path+"."+v.Type().Field(i).Name
			if field.Kind() == reflect.Struct {
				columns(field, name, f)
				continue
			}
			require.Equal(t, reflect.Slice, field.Kind(), name)
			// The fields are unexported: reach them through their address.
			f(reflect.NewAt(field.Type(), unsafe.Pointer(field.UnsafeAddr())).Elem(), name)
		}
	}
	n := 0
	columns(reflect.ValueOf(&pl).Elem(), "plan", func(c reflect.Value, _ string) {
		c.Set(reflect.MakeSlice(c.Type(), 1, 4))
		n++
	})
	require.Greater(t, n, 30)
	pl.reset()
	columns(reflect.ValueOf(&pl).Elem(), "plan", func(c reflect.Value, name string) {
		assert.Zero(t, c.Len(), name)
		assert.Equal(t, 4, c.Cap(), name)
	})
}
