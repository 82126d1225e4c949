package http

import (
	_ "embed"

	"github.com/gofiber/fiber/v2"
)

// openAPIDocument is the HTTP contract as OpenAPI 3. A string, so that
// no handler can change it.
//
//go:embed openapi.yaml
var openAPIDocument string

// openAPI serves the contract. It changes only with a deploy, so caches may keep
// it briefly.
func (s *Server) openAPI(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, "application/yaml; charset=utf-8")
	c.Set(fiber.HeaderCacheControl, "public, max-age=300")
	return c.SendString(openAPIDocument)
}
