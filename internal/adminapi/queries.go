package adminapi

// listFailedPageSQL pages FAILED rows in seq order after the seq $2 (0: from
// the start). It is relay.ListFailed's query with a keyset cursor and
// without the payload column: the API never returns payloads, so it never
// reads them. Keyset on seq (unique, indexed) keeps a page boundary stable
// while rows are replayed or parked between two requests, which an offset
// would not.
const listFailedPageSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, ''), created_at, failed_at
FROM bridge.outbox
WHERE status = 'FAILED' AND ($1 = '' OR topic = $1) AND seq > $2
ORDER BY seq
LIMIT $3`
