// Place an order and enqueue its event and its confirmation email, in one
// transaction: the messages exist exactly when the order does (docs/producers.md).
// Mirrors examples/node/enqueue.js, which runs in CI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type order struct {
	ID     int64
	Total  float64
	Stream string
	To     string
}

func placeOrder(ctx context.Context, conn *pgx.Conn, o order) (map[string]string, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) // a no-op after Commit

	// Stands for your own business write.
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL)"); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", o.ID, o.Total); err != nil {
		return nil, err
	}

	payload, _ := json.Marshal(map[string]any{"order_id": o.ID, "total": o.Total})
	var eventID, emailID string
	if err := tx.QueryRow(ctx,
		`SELECT outbox_enqueue_event_v1(stream => $1, type => 'order.placed', payload => $2::json, key => $3)::text`,
		o.Stream, string(payload), fmt.Sprintf("order-%d", o.ID)).Scan(&eventID); err != nil {
		return nil, err
	}
	if err := tx.QueryRow(ctx,
		`SELECT outbox_enqueue_email_v1("to" => $1::text[], subject => $2, text => $3, key => $4)::text`,
		[]string{o.To}, fmt.Sprintf("Order %d confirmed", o.ID), fmt.Sprintf("Thank you for order %d.", o.ID),
		fmt.Sprintf("order-%d", o.ID)).Scan(&emailID); err != nil {
		return nil, err
	}

	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return map[string]string{"event_id": eventID, "email_id": emailID}, nil
}

func main() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	defer conn.Close(ctx)

	ids, err := placeOrder(ctx, conn, order{ID: 1001, Total: 42.5, Stream: "orders", To: "buyer@example.com"})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == "OB":
		// The outbox refused a field: its name is pgErr.ColumnName, and the message starts with it.
		fmt.Fprintln(os.Stderr, "refused:", pgErr.Message)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(ids)
	fmt.Println(string(out))
}
