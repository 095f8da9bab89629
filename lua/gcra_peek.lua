-- The end of the GCRA peek (lua/gcra.lua, then this): what a check of the
-- same calls would answer, with nothing stored. A denied check stores
-- nothing either, so a peek's denial is exactly the check's.
return replies
