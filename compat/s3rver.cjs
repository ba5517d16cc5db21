// Starts a fake S3 server for the Go tests (backup_s3_test.go, backup_test.go).
// @20minutes/s3rver is used rather than s3rver: s3rver 3.7.1 accepts any
// well-formed Signature Version 4 header without checking it, and the
// point of the tests is a server that refuses a wrong signature.
//
//   node s3rver.cjs DIR BUCKET...
//
// prints {"port":N} on one line once it listens, and exits when its
// standard input closes (so it cannot outlive the test that started it).
const S3rver = require('@20minutes/s3rver');

const [directory, ...buckets] = process.argv.slice(2);
const server = new S3rver({
  address: '127.0.0.1',
  port: 0,
  silent: process.env.S3RVER_VERBOSE !== '1',
  directory,
  configureBuckets: buckets.map((name) => ({ name })),
});
server.run().then(
  ({ port }) => process.stdout.write(JSON.stringify({ port }) + '\n'),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
