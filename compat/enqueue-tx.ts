// The Node example of docs/postgresql.md ("Enqueue in your transaction"),
// run by TestPGEnqueueFromNode: node-postgres, a job pushed in the
// transaction that writes the row it is about; and one rolled back.
// QUEUED_PG_URL and QUEUED_NS name the database and the namespace; it
// prints the committed job's id.
import pg from "pg";

const ns = process.env.QUEUED_NS!;
const client = new pg.Client({ connectionString: process.env.QUEUED_PG_URL });
await client.connect();
await client.query(`CREATE TABLE IF NOT EXISTS queued_${ns}.orders (id int, total numeric)`);

// The example.
async function placeOrder(id: number, total: number, fail: boolean): Promise<string> {
  try {
    await client.query("BEGIN");
    await client.query(`INSERT INTO queued_${ns}.orders (id, total) VALUES ($1, $2)`, [id, total]);
    const { rows } = await client.query(`SELECT queued_${ns}.push($1, $2, $3, $4) AS id`, [
      "emails", "receipt", JSON.stringify({ order: id }), JSON.stringify({ maxAttempts: 5 }),
    ]);
    if (fail) throw new Error("the order failed");
    await client.query("COMMIT");
    return rows[0].id;
  } catch (e) {
    await client.query("ROLLBACK");
    throw e;
  }
}

await placeOrder(41, 10, true).catch(() => {});
console.log(await placeOrder(42, 99.5, false));
await client.end();
