// Place an order and enqueue its event and its confirmation email, in one
// transaction: the messages exist exactly when the order does (docs/producers.md).
//
//   DATABASE_URL=postgres://app@db/shop node enqueue.js [--stream orders] [--to buyer@example.com]
//
// Prints the two message ids as JSON. A refusal (SQLSTATE OB001/OB002) is one
// line naming the field, exit status 2, and nothing is written.
"use strict";

const { Client } = require("pg");

function option(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

async function placeOrder(client, order) {
  await client.query("BEGIN");
  try {
    // Stands for your own business write.
    await client.query("CREATE TEMP TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL)");
    await client.query("INSERT INTO orders (id, total) VALUES ($1, $2)", [order.id, order.total]);

    const event = await client.query(
      `SELECT outbox_enqueue_event_v1(stream => $1, type => 'order.placed', payload => $2::json,
                                      key => $3, traceparent => $4) AS id`,
      [order.stream, JSON.stringify({ order_id: order.id, total: order.total }), `order-${order.id}`,
       order.traceparent]);
    const email = await client.query(
      `SELECT outbox_enqueue_email_v1("to" => $1::text[], subject => $2, text => $3, key => $4) AS id`,
      [[order.to], `Order ${order.id} confirmed`, `Thank you for order ${order.id}.`, `order-${order.id}`]);

    await client.query("COMMIT");
    return { event_id: event.rows[0].id, email_id: email.rows[0].id };
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  }
}

async function main() {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    const ids = await placeOrder(client, {
      id: Number(option("order", "1001")),
      total: 42.5,
      stream: option("stream", "orders"),
      to: option("to", "buyer@example.com"),
      traceparent: option("traceparent", null),
    });
    console.log(JSON.stringify(ids));
  } catch (err) {
    if (typeof err.code === "string" && err.code.startsWith("OB")) {
      // The outbox refused a field: its name is err.column, and the message starts with it.
      console.error(`refused: ${err.message}`);
      process.exitCode = 2;
    } else {
      throw err;
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exitCode = 1;
});
