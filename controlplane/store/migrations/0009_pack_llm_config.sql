-- A pack may also carry LLM content policy (model_policy, content_inspection, sidecar_inspection),
-- composed on top of the base by the proxy's resolver when installed at platform or org scope.
ALTER TABLE policy_packs ADD COLUMN IF NOT EXISTS config text NOT NULL DEFAULT '{}'
