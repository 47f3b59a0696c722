-- Earlier releases stored a content_inspection value in its validated form, where an omitted
-- pii_detection.types ("every type") is null; the validator refuses null, so every snapshot carrying
-- such a row failed. Rewrite those rows to the form authoring stores now: the field absent, which
-- means the same. The LIKE guard keeps the jsonb cast to rows the old writer (JSON.stringify) produced.

UPDATE service_config SET value = ((value::jsonb) #- '{pii_detection,types}')::text
 WHERE key = 'content_inspection'
   AND CASE WHEN value LIKE '%"types":null%' THEN (value::jsonb) -> 'pii_detection' -> 'types' = 'null'::jsonb ELSE false END;

UPDATE agent_config SET value = ((value::jsonb) #- '{pii_detection,types}')::text
 WHERE key = 'content_inspection'
   AND CASE WHEN value LIKE '%"types":null%' THEN (value::jsonb) -> 'pii_detection' -> 'types' = 'null'::jsonb ELSE false END;

UPDATE policy_packs SET config = ((config::jsonb) #- '{content_inspection,pii_detection,types}')::text
 WHERE CASE WHEN config LIKE '%"types":null%' THEN (config::jsonb) -> 'content_inspection' -> 'pii_detection' -> 'types' = 'null'::jsonb ELSE false END;
