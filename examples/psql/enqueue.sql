-- Place an order and enqueue its event and its confirmation email, in one
-- transaction: the messages exist exactly when the order does (docs/producers.md).
--
--   psql "$DATABASE_URL" -v stream=orders -v to=buyer@example.com -v order=1001 -f enqueue.sql
--
-- Prints the two message ids. A refusal (SQLSTATE OB001/OB002) stops the script
-- before COMMIT (exit status 3, nothing written), with one line naming the field.
\set ON_ERROR_STOP on
\set VERBOSITY terse
\if :{?stream} \else \set stream orders \endif
\if :{?to} \else \set to buyer@example.com \endif
\if :{?order} \else \set order 1001 \endif

BEGIN;
-- Stands for your own business write.
CREATE TEMP TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL);
INSERT INTO orders (id, total) VALUES (:'order', 42.50);

SELECT outbox_enqueue_event_v1(
           stream => :'stream', type => 'order.placed',
           payload => json_build_object('order_id', CAST(:'order' AS bigint), 'total', 42.50),
           key => 'order-' || :'order') AS event_id \gset
SELECT outbox_enqueue_email_v1(
           "to" => ARRAY[:'to'], subject => 'Order ' || :'order' || ' confirmed',
           text => 'Thank you for order ' || :'order' || '.', key => 'order-' || :'order') AS email_id \gset
COMMIT;

\echo event_id :event_id
\echo email_id :email_id
