-- The end of a window charge: the figures of now, after the charge, from
-- the decision part's verdicts on a call of cost 1 (a denial has returned
-- already, with figures of now and the retry of that call). Every window
-- admits it: each reports its remaining and reset before the call, what
-- is left. A window's remaining before a call of cost 1 is its remaining
-- after it plus one under every algorithm, so the tightest is the same.
-- Transcribes standing in src/window.rs.
for i = 1, n do
  remaining[i], reset[i] = remaining0[i], reset0[i]
end
return reply(1, tight, 0, 0)
