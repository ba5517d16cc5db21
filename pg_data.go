package main

// A big job's data beside its record. A job's row keeps its record in
// body, data included, and every change the record takes (a FAIL, a
// retry, a move to the DLQ, a flow's bookkeeping) wrote the whole record
// again: 0.3-0.55 s for a FAIL of a job of 9.9 MB, where reading it took
// 0.03-0.16 s. The data of a job of pgDataApart bytes or more is now kept
// in the row's data column, beside a record without it, which an UPDATE
// that does not set the column leaves where it is (PostgreSQL keeps an
// unchanged TOASTed value); the column is written only when the data
// changed.
//
// A record without its data is of version recordVersionApart, which a
// build from before refuses as newer (rather than read a job with no
// data, or write its record whole beside a column that would then win).
// A row whose data column is NULL holds its data in its record: small
// jobs, rows written before (and by queued migrate), whose data moves to
// the column the first time their record is written again.

// pgDataApart is the size from which a job's data is kept beside its
// record: a little over PostgreSQL's TOAST threshold (2 KB), under which
// a record written again costs no more for its data.
const pgDataApart = 8 << 10

const pgDataMigration = `-- MIGRATION data apart
	ALTER TABLE {s}.jobs ADD COLUMN data BYTEA;`

// pgDataOf says how a job's record is written: apart, without its data
// (then data is the data column to write, or nil with keep: the column
// holds it already), or whole, with the column NULL.
func pgDataOf(j *Job) (apart bool, data []byte, keep bool) {
	if len(j.Data) < pgDataApart {
		return false, nil, false
	}
	if old := j.cold().pgData; len(old) == len(j.Data) && &old[0] == &j.Data[0] {
		return true, nil, true
	}
	return true, j.Data, false
}
