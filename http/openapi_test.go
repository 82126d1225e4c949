package http

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadOpenAPIDoc parses and validates the embedded document; every other OpenAPI
// test starts from it.
func loadOpenAPIDoc(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData([]byte(openAPIDocument))
	require.NoError(t, err, "openapi.yaml does not parse")
	require.NoError(t, doc.Validate(loader.Context), "openapi.yaml is not valid OpenAPI")
	return doc
}

func newOpenAPITestServer(t *testing.T, checks []Check) *Server {
	t.Helper()
	return newTestApp(t, checks...).srv
}

func TestOpenAPIDocumentIsValid(t *testing.T) {
	doc := loadOpenAPIDoc(t)
	assert.Equal(t, "3.0.3", doc.OpenAPI)
	require.NotNil(t, doc.Components)
	assert.Contains(t, doc.Components.SecuritySchemes, "bearerAuth")
	assert.Contains(t, doc.Components.Schemas, "Error")
}

// TestOpenAPIDocumentsEveryRoute keeps the document and the router in step: every
// registered route is documented, and every documented operation is registered
// unless notYetServed lists it.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	// notYetServed lists the documented operations that no handler serves yet.
	// Delete an entry in the change that registers its route: the test fails while
	// a served route is still listed, so the list stays honest.
	notYetServed := map[string]string{}

	doc := loadOpenAPIDoc(t)
	documented := documentedOperations(doc)
	served := servedOperations(newOpenAPITestServer(t, nil).App())

	for _, op := range slices.Sorted(maps.Keys(served)) {
		if !documented[op] {
			t.Errorf("%s is registered but not in openapi.yaml (path parameters must be named, e.g. /media/:key, not wildcards)", op)
		}
	}
	for _, op := range slices.Sorted(maps.Keys(documented)) {
		_, pending := notYetServed[op]
		switch {
		case served[op] && pending:
			t.Errorf("%s is registered now: delete it from notYetServed", op)
		case !served[op] && !pending:
			t.Errorf("%s is in openapi.yaml but not registered (add the route, or list it in notYetServed)", op)
		}
	}
	for _, op := range slices.Sorted(maps.Keys(notYetServed)) {
		if !documented[op] {
			t.Errorf("notYetServed lists %s, which openapi.yaml does not document", op)
		}
	}
}

func TestOpenAPIIsServed(t *testing.T) {
	app := newOpenAPITestServer(t, nil).App()
	resp, err := app.Test(httptest.NewRequest(fiber.MethodGet, "/openapi.yaml", nil), -1)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	require.Equal(t, fiber.StatusOK, resp.StatusCode, "body: %s", body)
	assert.Equal(t, "application/yaml; charset=utf-8", resp.Header.Get(fiber.HeaderContentType))
	assert.NotEmpty(t, resp.Header.Get(fiber.HeaderCacheControl))
	assert.Equal(t, openAPIDocument, string(body))
	_, err = openapi3.NewLoader().LoadFromData(body)
	assert.NoError(t, err, "the served document does not parse")
}

// TestOpenAPIOperationsFollowTheConventions checks, operation by operation, the
// conventions of the contract that the schema language cannot express.
func TestOpenAPIOperationsFollowTheConventions(t *testing.T) {
	// operationalReads read no projection, so they take no X-Min-Position
	// (the stream reads the log itself; its X-Position is where it starts).
	operationalReads := []string{
		"GET /healthz", "GET /readyz", "GET /metrics", "GET /openapi.yaml", "GET /media/{key}", "GET /stream",
	}
	doc := loadOpenAPIDoc(t)
	templateParam := regexp.MustCompile(`\{([^}]+)\}`)

	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			t.Run(name, func(t *testing.T) {
				params := map[string]*openapi3.Parameter{}
				for _, p := range append(slices.Clone(item.Parameters), op.Parameters...) {
					params[p.Value.In+" "+p.Value.Name] = p.Value
				}

				// Every template parameter is declared, required, with a schema.
				for _, m := range templateParam.FindAllStringSubmatch(path, -1) {
					p := params[openapi3.ParameterInPath+" "+m[1]]
					if assert.NotNil(t, p, "path parameter {%s} is not declared", m[1]) {
						assert.True(t, p.Required, "path parameter {%s} must be required", m[1])
						assert.NotNil(t, p.Schema, "path parameter {%s} has no schema", m[1])
					}
				}

				// Every error answer has the shared error body; a 503 says when to retry.
				require.NotNil(t, op.Responses)
				for status, resp := range op.Responses.Map() {
					if !strings.HasPrefix(status, "4") && !strings.HasPrefix(status, "5") {
						continue
					}
					media := resp.Value.Content.Get(fiber.MIMEApplicationJSON)
					if assert.NotNil(t, media, "%s has no JSON body", status) && assert.NotNil(t, media.Schema, "%s has no schema", status) {
						assert.Equal(t, "#/components/schemas/Error", media.Schema.Ref, "%s does not use the Error schema", status)
					}
					if status == "503" {
						assert.Contains(t, resp.Value.Headers, fiber.HeaderRetryAfter, "503 without Retry-After")
					}
				}

				// Every route bounds its body: a route without one refuses any.
				if tooLarge := op.Responses.Value("413"); assert.NotNil(t, tooLarge, "no 413") && op.RequestBody == nil {
					assert.Equal(t, "#/components/responses/NoBodyTaken", tooLarge.Ref, "a route without a body refuses one")
				}

				// Auth is always explicit; protected and optional-auth routes document 401.
				require.NotNil(t, op.Security, "security is not stated")
				auth := authOf(*op.Security)
				if auth != "public" {
					assert.NotNil(t, op.Responses.Value("401"), "%s route without 401", auth)
				} else {
					assert.Nil(t, op.Responses.Value("401"), "public route with 401")
				}

				switch {
				case strings.HasPrefix(path, "/admin/"):
					// Operators' routes: admin tokens only; not commands of the log.
					assert.Equal(t, "required", auth, "an admin route must need auth")
					assert.NotNil(t, op.Responses.Value("403"), "admin route without 403")
				case method != fiber.MethodGet:
					// Commands: authenticated, idempotent, 202 with the log position.
					assert.Equal(t, "required", auth, "a command must need auth")
					assert.Contains(t, params, "header Idempotency-Key", "command without Idempotency-Key")
					accepted := op.Responses.Value("202")
					if assert.NotNil(t, accepted, "command without 202") {
						schema := accepted.Value.Content.Get(fiber.MIMEApplicationJSON).Schema.Value
						assert.Contains(t, schema.Required, "position", "202 body without position")
					}
					assert.Nil(t, op.Responses.Value("200"), "a command answers 202, not 200")
				case !slices.Contains(operationalReads, name):
					// Projection reads: read-your-writes headers.
					assert.Contains(t, params, "header X-Min-Position", "read without X-Min-Position")
					ok := op.Responses.Value("200")
					if assert.NotNil(t, ok, "read without 200") {
						assert.Contains(t, ok.Value.Headers, "X-Position", "read without X-Position")
					}
				}

				// Paged answers take a cursor and carry next_cursor and has_more.
				if ok := op.Responses.Value("200"); ok != nil {
					if media := ok.Value.Content.Get(fiber.MIMEApplicationJSON); media != nil {
						props := media.Schema.Value.Properties
						_, paged := props["next_cursor"]
						assert.Equal(t, paged, params["query cursor"] != nil, "cursor parameter and next_cursor must come together")
						if paged {
							assert.Contains(t, props, "has_more")
							assert.True(t, props["next_cursor"].Value.Nullable, "next_cursor must be nullable")
						}
					}
				}
			})
		}
	}
}

// TestOpenAPIMatchesServedAnswers checks real answers of the served routes
// against the document's schemas.
func TestOpenAPIMatchesServedAnswers(t *testing.T) {
	doc := loadOpenAPIDoc(t)
	down := []Check{{Name: "log", Probe: func(context.Context) error { return errors.New("connection refused") }}}

	tests := []struct {
		name   string
		checks []Check
		path   string
		status int
		schema *openapi3.Schema
	}{
		{"alive", nil, "/healthz", fiber.StatusOK, jsonSchema(t, doc, "/healthz", "200")},
		{"ready", nil, "/readyz", fiber.StatusOK, jsonSchema(t, doc, "/readyz", "200")},
		{"not ready", down, "/readyz", fiber.StatusServiceUnavailable, jsonSchema(t, doc, "/readyz", "503")},
		{"unknown route", nil, "/no/such/route", fiber.StatusNotFound, doc.Components.Schemas["Error"].Value},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := newOpenAPITestServer(t, tt.checks).App()
			resp, err := app.Test(httptest.NewRequest(fiber.MethodGet, tt.path, nil), -1)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)

			require.Equal(t, tt.status, resp.StatusCode, "body: %s", body)
			var value any
			require.NoError(t, json.Unmarshal(body, &value), "body: %s", body)
			assert.NoError(t, tt.schema.VisitJSON(value), "body: %s", body)
			if tt.status == fiber.StatusServiceUnavailable {
				assert.NotEmpty(t, resp.Header.Get(fiber.HeaderRetryAfter))
			}
		})
	}
}

// documentedOperations returns the document's operations as "METHOD /path".
func documentedOperations(doc *openapi3.T) map[string]bool {
	ops := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops[method+" "+path] = true
		}
	}
	return ops
}

// servedOperations returns the app's routes as "METHOD /path" in OpenAPI's
// notation, leaving out middleware and the HEAD twin Fiber adds to every GET.
func servedOperations(app *fiber.App) map[string]bool {
	ops := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		ops[r.Method+" "+openAPIPath(r.Path)] = true
	}
	for op := range ops {
		if path, ok := strings.CutPrefix(op, fiber.MethodHead+" "); ok && ops[fiber.MethodGet+" "+path] {
			delete(ops, op)
		}
	}
	return ops
}

// openAPIPath turns Fiber's /posts/:id into OpenAPI's /posts/{id}, dropping
// optional marks and constraints (:id?, :id<int>).
func openAPIPath(fiberPath string) string {
	segments := strings.Split(fiberPath, "/")
	for i, s := range segments {
		if name, ok := strings.CutPrefix(s, ":"); ok {
			name, _, _ = strings.Cut(name, "<")
			segments[i] = "{" + strings.TrimSuffix(name, "?") + "}"
		}
	}
	return strings.Join(segments, "/")
}

// authOf names an operation's security: "public", "optional" or "required".
func authOf(reqs openapi3.SecurityRequirements) string {
	anonymous, bearer := len(reqs) == 0, false
	for _, r := range reqs {
		if len(r) == 0 {
			anonymous = true
		}
		if _, ok := r["bearerAuth"]; ok {
			bearer = true
		}
	}
	switch {
	case !bearer:
		return "public"
	case anonymous:
		return "optional"
	default:
		return "required"
	}
}

// jsonSchema returns the JSON body schema of one GET answer in the document.
func jsonSchema(t *testing.T, doc *openapi3.T, path, status string) *openapi3.Schema {
	t.Helper()
	item := doc.Paths.Value(path)
	require.NotNil(t, item, "no path %s", path)
	require.NotNil(t, item.Get, "no GET %s", path)
	resp := item.Get.Responses.Value(status)
	require.NotNil(t, resp, "no %s answer for GET %s", status, path)
	media := resp.Value.Content.Get(fiber.MIMEApplicationJSON)
	require.NotNil(t, media, "no JSON body for %s of GET %s", status, path)
	return media.Schema.Value
}
