// Package adminapi is the admin HTTP API: the operator commands of the CLI
// (`bridge outbox`, `bridge subscriptions`, `bridge deliveries`) as JSON
// endpoints on the ops server (HTTP_ADDR), next to /healthz and /metrics.
//
//	GET    /api/v1/outbox/stats
//	GET    /api/v1/outbox/failed                 ?topic ?limit ?cursor (never payloads)
//	POST   /api/v1/outbox/replay                 {"ids":[…]} | {"all_failed":true,"topic":…,"since":"2h"}
//	GET    /api/v1/subscriptions                 ?limit ?cursor (never secrets)
//	POST   /api/v1/subscriptions                 → 201, the secret (shown once)
//	GET    /api/v1/subscriptions/{id}
//	PATCH  /api/v1/subscriptions/{id}
//	DELETE /api/v1/subscriptions/{id}
//	POST   /api/v1/subscriptions/{id}/rotate-secret → the new secret (shown once)
//	POST   /api/v1/subscriptions/{id}/enable
//	POST   /api/v1/subscriptions/{id}/disable    {"reason":…} optional
//	GET    /api/v1/deliveries                    ?subscription ?status ?asset ?limit ?cursor (never payloads)
//	GET    /api/v1/deliveries/{id}
//	GET    /api/v1/deliveries/{id}/attempts      ?limit ?cursor (both lanes)
//	GET    /api/v1/attempts                      ?subscription ?event ?limit ?cursor (both lanes)
//	POST   /api/v1/deliveries/revive             {"ids":[…]} | {"subscription_id":…,"dead":true}
//	POST   /api/v1/deliveries/recover            {"subscription_id":…,"since":…,"until":…} a window's dead ones
//	GET    /openapi.json                         api/openapi.json (no token needed)
//
// The API exists only when ADMIN_TOKEN is set: without it nothing is
// mounted and those paths are 404, so a replica started without thinking
// about the admin API does not expose one. Every /api/v1 request carries
// "Authorization: Bearer <ADMIN_TOKEN>"; the token is compared in constant
// time over fixed-length digests, so neither its content nor its length
// leaks through response timing.
//
// Errors are JSON, {"error": "...", "field": "..."}, with field naming the
// body field, query parameter, path parameter or header at fault. Input is
// validated completely before anything is written, and a request that writes
// several rows writes them in one transaction (the stores' own), so a 4xx
// never leaves a partial write behind. Lists page by an opaque cursor
// (next_cursor), never by offset: a page boundary does not shift when rows
// are added or removed between two requests.
package adminapi
