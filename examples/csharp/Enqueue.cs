// Place an order and enqueue its event and its confirmation email, in one
// transaction: the messages exist exactly when the order does (docs/producers.md).
// Mirrors examples/node/enqueue.js, which runs in CI. Package: Npgsql.
using System;
using System.Text.Json;
using System.Threading.Tasks;
using Npgsql;

public static class Enqueue
{
    static async Task<(Guid EventId, Guid EmailId)> PlaceOrder(NpgsqlConnection conn, long id, decimal total,
                                                               string stream, string to)
    {
        using (var tx = await conn.BeginTransactionAsync())
        {
            try
            {
                // Stands for your own business write.
                using (var create = new NpgsqlCommand(
                    "CREATE TEMP TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL)", conn, tx))
                    await create.ExecuteNonQueryAsync();
                using (var insert = new NpgsqlCommand("INSERT INTO orders (id, total) VALUES ($1, $2)", conn, tx))
                {
                    insert.Parameters.AddWithValue(id);
                    insert.Parameters.AddWithValue(total);
                    await insert.ExecuteNonQueryAsync();
                }

                Guid eventId, emailId;
                using (var ev = new NpgsqlCommand(
                    "SELECT outbox_enqueue_event_v1(stream => $1, type => 'order.placed', payload => $2::json, key => $3)",
                    conn, tx))
                {
                    ev.Parameters.AddWithValue(stream);
                    ev.Parameters.AddWithValue(JsonSerializer.Serialize(new { order_id = id, total }));
                    ev.Parameters.AddWithValue($"order-{id}");
                    eventId = (Guid)await ev.ExecuteScalarAsync();
                }
                using (var email = new NpgsqlCommand(
                    "SELECT outbox_enqueue_email_v1(\"to\" => $1, subject => $2, text => $3, key => $4)", conn, tx))
                {
                    email.Parameters.AddWithValue(new[] { to });
                    email.Parameters.AddWithValue($"Order {id} confirmed");
                    email.Parameters.AddWithValue($"Thank you for order {id}.");
                    email.Parameters.AddWithValue($"order-{id}");
                    emailId = (Guid)await email.ExecuteScalarAsync();
                }

                await tx.CommitAsync();
                return (eventId, emailId);
            }
            catch
            {
                await tx.RollbackAsync();
                throw;
            }
        }
    }

    public static int Main()
    {
        // A connection string, e.g. "Host=db;Database=shop;Username=app".
        using (var conn = new NpgsqlConnection(Environment.GetEnvironmentVariable("NPGSQL_CONNECTION")))
        {
            conn.Open();
            try
            {
                var ids = PlaceOrder(conn, 1001, 42.5m, "orders", "buyer@example.com").GetAwaiter().GetResult();
                Console.WriteLine(JsonSerializer.Serialize(new { event_id = ids.EventId, email_id = ids.EmailId }));
                return 0;
            }
            catch (PostgresException e) when (e.SqlState.StartsWith("OB"))
            {
                // The outbox refused a field: its name is e.ColumnName, and the message starts with it.
                Console.Error.WriteLine($"refused: {e.MessageText}");
                return 2;
            }
        }
    }
}
