-- Device conditions (issue 22): each phone's health as its host's probes last saw it. Only
-- a 'ready' phone takes work (amc_acquire); the rest are held, and pending_reasons counts
-- them by condition. The facts behind the condition (battery, temperature, when probed)
-- are shown to operators. A host that never probes leaves its phones 'ready'.
ALTER TABLE devices
    ADD COLUMN condition text NOT NULL DEFAULT 'ready' CHECK (condition IN
        ('ready', 'charging_hold', 'too_hot', 'unresponsive', 'booting', 'recovering',
         'quarantined', 'offline')),
    ADD COLUMN condition_reason text NOT NULL DEFAULT '',
    ADD COLUMN battery_percent integer,
    ADD COLUMN temperature_celsius real,
    ADD COLUMN charging boolean,
    ADD COLUMN probed_at timestamptz;
