-- Every device carries its host's id as the label host_id (RegisterHost sets it, over any
-- host_id the host or the device name): a serial is unique on its host only, so a selector
-- of serial and host_id names one phone. The devices registered before get it now, without
-- waiting for their hosts to register again (a host does at start-up and when its phones
-- change).
UPDATE devices SET labels = labels || jsonb_build_object('host_id', host_id)
WHERE labels->>'host_id' IS DISTINCT FROM host_id;
