import type { FastifyPluginAsync } from 'fastify';

/**
 * Marks a plugin as not encapsulated: what it adds (an error handler, a hook, a not-found handler)
 * applies to the instance it is registered on, as `fastify-plugin` does, by the same two symbols
 * fastify reads (lib/plugin-utils.js). fastify-plugin itself is not a dependency
 * (docs/decisions.md, "Control-plane store modules and plugins").
 */
export function shared<O extends Record<string, unknown>>(
  name: string,
  plugin: FastifyPluginAsync<O>,
): FastifyPluginAsync<O> {
  Object.assign(plugin, { [Symbol.for('skip-override')]: true, [Symbol.for('fastify.display-name')]: name });
  return plugin;
}
