// Place an order and enqueue its event and its confirmation email, in one
// transaction: the messages exist exactly when the order does (docs/producers.md).
// Mirrors examples/node/enqueue.js, which runs in CI. Driver: org.postgresql:postgresql (JDBC).
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

public final class Enqueue {
    static String[] placeOrder(Connection conn, long id, double total, String stream, String to) throws SQLException {
        conn.setAutoCommit(false);
        try {
            // Stands for your own business write.
            try (Statement create = conn.createStatement()) {
                create.execute("CREATE TEMP TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL)");
            }
            try (PreparedStatement insert = conn.prepareStatement("INSERT INTO orders (id, total) VALUES (?, ?)")) {
                insert.setLong(1, id);
                insert.setDouble(2, total);
                insert.executeUpdate();
            }

            String eventId, emailId;
            try (PreparedStatement ev = conn.prepareStatement(
                    "SELECT outbox_enqueue_event_v1(stream => ?, type => 'order.placed', payload => ?::json, key => ?)::text")) {
                ev.setString(1, stream);
                ev.setString(2, String.format("{\"order_id\":%d,\"total\":%s}", id, total));
                ev.setString(3, "order-" + id);
                try (ResultSet rs = ev.executeQuery()) { rs.next(); eventId = rs.getString(1); }
            }
            try (PreparedStatement email = conn.prepareStatement(
                    "SELECT outbox_enqueue_email_v1(\"to\" => ?, subject => ?, text => ?, key => ?)::text")) {
                email.setArray(1, conn.createArrayOf("text", new String[] {to}));
                email.setString(2, "Order " + id + " confirmed");
                email.setString(3, "Thank you for order " + id + ".");
                email.setString(4, "order-" + id);
                try (ResultSet rs = email.executeQuery()) { rs.next(); emailId = rs.getString(1); }
            }

            conn.commit();
            return new String[] {eventId, emailId};
        } catch (SQLException e) {
            conn.rollback();
            throw e;
        }
    }

    public static void main(String[] args) throws SQLException {
        // jdbc:postgresql://db/shop?user=app
        try (Connection conn = DriverManager.getConnection(System.getenv("JDBC_DATABASE_URL"))) {
            String[] ids = placeOrder(conn, 1001, 42.5, "orders", "buyer@example.com");
            System.out.printf("{\"event_id\":\"%s\",\"email_id\":\"%s\"}%n", ids[0], ids[1]);
        } catch (SQLException e) {
            String state = e.getSQLState();
            if (state == null || !state.startsWith("OB")) throw e;
            // The outbox refused a field: the message's first line names it (and PSQLException's
            // getServerErrorMessage().getColumn() is its name).
            System.err.println("refused: " + e.getMessage().lines().findFirst().orElse(""));
            System.exit(2);
        }
    }
}
